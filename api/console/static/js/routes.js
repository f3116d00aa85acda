// The console's addresses: hash routes, so the broker serves one page and the browser's back
// button and bookmarks work. #/overview, #/tenants, #/cluster, #/ns/{tenant}/{namespace} and
// #/topic/{tenant}/{namespace}/{topic}/{tab}.

const enc = encodeURIComponent;

export const TOPIC_TABS = ["overview", "messages", "tail", "storage", "schema"];

export function nsHref(tenant, namespace) {
  return `#/ns/${enc(tenant)}/${enc(namespace)}`;
}

export function topicHref(tenant, namespace, topic, tab = "overview") {
  return `#/topic/${enc(tenant)}/${enc(namespace)}/${enc(topic)}/${tab}`;
}

/** The route in the address bar: {view, ...parameters}; unknown addresses are the overview. */
export function currentRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  if (parts[0] === "tenants") return { view: "tenants" };
  if (parts[0] === "cluster") return { view: "cluster" };
  if (parts[0] === "ns" && parts.length === 3) return { view: "namespace", tenant: parts[1], namespace: parts[2] };
  if (parts[0] === "topic" && (parts.length === 4 || parts.length === 5)) {
    const tab = TOPIC_TABS.includes(parts[4]) ? parts[4] : "overview";
    return { view: "topic", tenant: parts[1], namespace: parts[2], topic: parts[3], tab };
  }
  return { view: "overview" };
}

/**
 * Where a name typed in the "open" box leads: "tenant/namespace", "tenant/namespace/topic",
 * "persistent://tenant/namespace/topic", or a bare topic name (in public/default, as the APIs
 * read short names). Null for something else.
 */
export function hrefOfName(text) {
  const name = text.trim().replace(/^persistent:\/\//, "");
  const parts = name.split("/").filter(Boolean);
  if (parts.length === 1) return topicHref("public", "default", parts[0]);
  if (parts.length === 2) return nsHref(parts[0], parts[1]);
  if (parts.length === 3) return topicHref(parts[0], parts[1], parts[2]);
  return null;
}
