// Building the page: elements from data (text is always set as text, never parsed as HTML),
// the panels every view is made of, error boxes and number formatting.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  // The broker judges input and says what is wrong with it; the browser's own checks (min,
  // required) would block the request and hide that answer.
  if (tag === "form") el.noValidate = true;
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "value") el.value = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function panel(title, ...children) {
  return h("section", { class: "panel" }, title ? h("h2", {}, title) : null, ...children);
}

/** An API error ({status, code, message}) or any other failure, as the page shows it. */
export function errorBox(error) {
  const status = error && error.status ? `${error.status} ` : "";
  const code = (error && error.code) || "error";
  const message = (error && error.message) || String(error);
  return h("div", { class: "error", role: "alert", dataset: { code } },
    h("strong", {}, `${status}${code}`), " ", h("span", { class: "error-message" }, message));
}

export function notice(text, kind = "ok") {
  return h("div", { class: `notice notice-${kind}`, role: "status" }, text);
}

export function loading() {
  return h("p", { class: "muted" }, "Loading…");
}

/** A labelled form field. */
export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", { class: "field-label" }, label), input,
    hint ? h("span", { class: "field-hint" }, hint) : null);
}

export function button(text, onclick, attrs = {}) {
  return h("button", { type: "button", ...attrs, onclick }, text);
}

/** A table from column definitions [{label, value(row) -> node or text, class}] and rows. */
export function table(columns, rows, { empty = "Nothing to show.", rowAttrs } = {}) {
  if (!rows.length) return h("p", { class: "muted empty" }, empty);
  return h("div", { class: "table-wrap" }, h("table", {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.class }, c.label)))),
    h("tbody", {}, rows.map((row) => h("tr", rowAttrs ? rowAttrs(row) : {},
      columns.map((c) => h("td", { class: c.class, "data-label": c.label }, c.value(row))))))));
}

/** A figure: a label and a value (kept raw in data-value for whoever reads the page). */
export function stat(label, text, raw, name) {
  return h("div", { class: "stat", dataset: name ? { stat: name } : {} },
    h("span", { class: "stat-label" }, label),
    h("span", { class: "stat-value", dataset: { value: raw === undefined || raw === null ? "" : String(raw) } },
      text));
}

export function link(href, text) {
  return h("a", { href }, text);
}

// --- formatting -------------------------------------------------------------------------------
const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function fmtBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  let value = Number(bytes);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${BYTE_UNITS[unit]}`;
}

export function fmtCount(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US");
}

export function fmtRate(n, unit = "msg/s") {
  if (n === null || n === undefined) return "–";
  const value = Number(n);
  const digits = value !== 0 && Math.abs(value) < 10 ? 2 : value < 1000 ? 1 : 0;
  return `${value.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 })} ${unit}`;
}

export function fmtByteRate(n) {
  if (n === null || n === undefined) return "–";
  return `${fmtBytes(n)}/s`;
}

export function fmtRatio(ratio) {
  if (ratio === null || ratio === undefined) return "no reads yet";
  return `${(ratio * 100).toFixed(1)} %`;
}

export function fmtMicros(us) {
  if (us === null || us === undefined) return "–";
  if (us >= 1000) return `${(us / 1000).toFixed(2)} ms`;
  return `${us.toFixed(0)} µs`;
}

export function fmtDuration(seconds) {
  const s = Math.floor(seconds);
  const days = Math.floor(s / 86400);
  const hours = Math.floor((s % 86400) / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const parts = [];
  if (days) parts.push(`${days} d`);
  if (days || hours) parts.push(`${hours} h`);
  if (days || hours || minutes) parts.push(`${minutes} min`);
  parts.push(`${s % 60} s`);
  return parts.join(" ");
}

/** Epoch milliseconds from "2026-01-31 12:00[:00]" (local time), an ISO time or a number. */
export function parseTime(text) {
  const value = text.trim();
  if (/^\d+$/.test(value)) return Number(value);
  const ms = Date.parse(value.replace(" ", "T"));
  if (Number.isNaN(ms)) {
    throw Object.assign(new Error(`"${value}" is not a time: write 2026-01-31 12:00:00 (local) or epoch ms`),
      { code: "invalid_time" });
  }
  return ms;
}

export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "–";
  const date = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}.${pad(date.getMilliseconds(), 3)}`;
}

/**
 * Pulsar's base64 MessageIdData as "ledger:entry:partition[:batch]" (the form REST produce and
 * the admin API use), or null when it cannot be read.
 */
export function messageIdText(base64) {
  let bytes;
  try {
    bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  } catch {
    return null;
  }
  const fields = { 1: -1n, 2: -1n, 3: -1n, 4: -1n };
  let at = 0;
  const varint = () => {
    let value = 0n;
    for (let shift = 0n; at < bytes.length && shift < 70n; shift += 7n) {
      const b = bytes[at++];
      value |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return value;
    }
    throw new Error("truncated varint");
  };
  try {
    while (at < bytes.length) {
      const tag = varint();
      if ((tag & 7n) !== 0n) return null;
      const value = BigInt.asIntN(64, varint());
      fields[Number(tag >> 3n)] = value;
    }
  } catch {
    return null;
  }
  const [ledger, entry, partition, batch] = [fields[1], fields[2], fields[3], fields[4]];
  return batch >= 0n ? `${ledger}:${entry}:${partition}:${batch}` : `${ledger}:${entry}:${partition}`;
}
