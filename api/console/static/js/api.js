// Calls to the broker's public APIs, with the user's token.
//
// The token lives in sessionStorage (gone when the tab closes) and travels on every call:
// "Authorization: Bearer" over HTTP, "?token=" on WebSocket URLs (browsers cannot set headers
// there). Every failure becomes an ApiError carrying the API's {code, message}; a 401 also
// tells the listeners, so the page can ask for a token.

const TOKEN_KEY = "magnetar.console.token";
export const REQUEST_TIMEOUT_MS = 30000;
const ERROR_TEXT_SHOWN_MAX = 500;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const unauthorizedListeners = new Set();
const tokenListeners = new Set();

export function onUnauthorized(listener) {
  unauthorizedListeners.add(listener);
}

export function onTokenChange(listener) {
  tokenListeners.add(listener);
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  const trimmed = (value || "").trim();
  if (trimmed) sessionStorage.setItem(TOKEN_KEY, trimmed);
  else sessionStorage.removeItem(TOKEN_KEY);
  tokenListeners.forEach((listener) => listener(trimmed));
}

/** The token's role (its "sub" claim), for display only: the broker verifies the token. */
export function tokenRole(value = token()) {
  const parts = value.split(".");
  if (parts.length !== 3) return null;
  try {
    const json = atob(parts[1].replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(parts[1].length / 4) * 4, "="));
    const claims = JSON.parse(json);
    return typeof claims.sub === "string" ? claims.sub : null;
  } catch {
    return null;
  }
}

function errorOf(status, statusText, data) {
  if (data && typeof data === "object" && typeof data.message === "string") {
    return new ApiError(status, data.code || `http_${status}`, data.message);
  }
  if (data && typeof data === "object" && data.detail) {
    return new ApiError(status, `http_${status}`, JSON.stringify(data.detail).slice(0, ERROR_TEXT_SHOWN_MAX));
  }
  const text = typeof data === "string" && data ? data.slice(0, ERROR_TEXT_SHOWN_MAX) : statusText;
  return new ApiError(status, `http_${status}`, text || "request failed");
}

/** A fetch with the token and the request timeout; a failure to reach the broker is an ApiError. */
async function send(method, path, { query, body, headers = {} } = {}) {
  const current = token();
  const sent = current ? { ...headers, Authorization: `Bearer ${current}` } : headers;
  const search = query ? `?${new URLSearchParams(query)}` : "";
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
  try {
    return await fetch(path + search, { method, headers: sent, body, signal: controller.signal });
  } catch (error) {
    const why = error.name === "AbortError" ? `no answer within ${REQUEST_TIMEOUT_MS / 1000} s`
      : `the broker could not be reached (${error.message})`;
    throw new ApiError(0, "network_error", why);
  } finally {
    clearTimeout(timer);
  }
}

function parsed(raw) {
  if (!raw) return null;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

function refusal(response, data) {
  const error = errorOf(response.status, response.statusText, data);
  if (response.status === 401) unauthorizedListeners.forEach((listener) => listener(error));
  return error;
}

/**
 * One HTTP call. `json` is sent as JSON; `text` is sent as it is, as a JSON body the user
 * wrote (the API, not the page, judges it). Answers are parsed as JSON when they are JSON.
 */
export async function request(method, path, { query, json, text } = {}) {
  let body;
  if (text !== undefined) body = text;
  else if (json !== undefined) body = JSON.stringify(json);
  const headers = body !== undefined ? { "Content-Type": "application/json" } : {};
  const response = await send(method, path, { query, body, headers });
  const data = parsed(await response.text());
  if (!response.ok) throw refusal(response, data);
  return data;
}

/** One stored message as the admin API answers (peek, examine): its raw payload and headers. */
export async function getMessage(path) {
  const response = await send("GET", path);
  if (!response.ok) throw refusal(response, parsed(await response.text()));
  return { bytes: new Uint8Array(await response.arrayBuffer()), headers: response.headers };
}

export const get = (path, query) => request("GET", path, { query });
export const put = (path, json) => request("PUT", path, { json });
export const post = (path, json) => request("POST", path, { json });
export const del = (path, query) => request("DELETE", path, { query });

const enc = encodeURIComponent;

/** The paths of one topic on each API. */
export function topicPaths(tenant, namespace, topic) {
  const tail = `persistent/${enc(tenant)}/${enc(namespace)}/${enc(topic)}`;
  return {
    admin: `/admin/v2/${tail}`,
    rest: `/topics/${tail}`,
    reader: `/ws/v2/reader/${tail}`,
  };
}

export function namespacePaths(tenant, namespace) {
  const tail = `${enc(tenant)}/${enc(namespace)}`;
  return {
    admin: `/admin/v2/namespaces/${tail}`,
    topics: `/admin/v2/persistent/${tail}`,
    stats: `/admin/v2/broker-stats/namespaces/${tail}/topics`,
  };
}

/** A WebSocket URL on this broker, carrying the token as ?token= when there is one. */
export function webSocketUrl(path, query = {}) {
  const params = new URLSearchParams(query);
  const current = token();
  if (current) params.set("token", current);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}?${params}`;
}
