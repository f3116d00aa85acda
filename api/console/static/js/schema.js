// A topic's schema: every version the registry holds (GET /admin/v2/schemas/{t}/{ns}/{topic}/schemas,
// Pulsar's GetSchemaResponse: version, type, timestamp, data, properties) and its namespace's
// compatibility strategy (GET /admin/v2/namespaces/{t}/{ns}/schemaCompatibilityStrategy, which
// needs the tenant's administration; UNDEFINED means the broker's default applies).

import { get, namespacePaths } from "./api.js";
import { button, errorBox, fmtTime, h, loading, panel, replace, stat, table } from "./dom.js";

const enc = encodeURIComponent;

/** A schema's definition as text: JSON pretty-printed when it is JSON. */
function definition(data) {
  try {
    return JSON.stringify(JSON.parse(data), null, 2);
  } catch {
    return data;
  }
}

function versionsTable(versions) {
  return table([
    { label: "Version", class: "num", value: (v) => String(v.version) },
    { label: "Type", value: (v) => v.type },
    { label: "Registered", value: (v) => fmtTime(v.timestamp) },
    { label: "Properties", class: "mono", value: (v) => Object.entries(v.properties || {})
      .map(([k, value]) => `${k}=${value}`).join(", ") },
    { label: "Definition", value: (v) => (v.data ? h("details", {}, h("summary", {}, "show"),
      h("pre", { class: "payload json" }, definition(v.data))) : h("span", { class: "muted" }, "none")) },
  ], [...versions].reverse(), { empty: "No schema: producers and consumers may use any bytes.",
    rowAttrs: (v) => ({ dataset: { version: v.version } }) });
}

export function schemaTab(root, ctx) {
  const strategy = h("div", {}, loading());
  const versions = h("div", {}, loading());
  const admin = namespacePaths(ctx.tenant, ctx.namespace).admin;
  const schemas = `/admin/v2/schemas/${enc(ctx.tenant)}/${enc(ctx.namespace)}/${enc(ctx.topic)}/schemas`;
  let stopped = false;

  async function load() {
    const [named, listed] = await Promise.allSettled([get(`${admin}/schemaCompatibilityStrategy`), get(schemas)]);
    if (stopped) return;
    replace(strategy, named.status === "fulfilled" ? h("div", { class: "stats" },
      stat("Compatibility (namespace)", named.value, named.value, "schemaStrategy"),
      named.value === "UNDEFINED" ? h("p", { class: "muted" }, "The broker's default strategy applies.") : null)
      : errorBox(named.reason));
    replace(versions, listed.status === "fulfilled" ? versionsTable(listed.value.getSchemaResponses)
      : errorBox(listed.reason));
  }

  replace(root, panel("Schema", strategy, h("h3", {}, "Versions, newest first"), versions,
    h("div", { class: "form-row" }, button("Refresh", load))));
  load();
  return () => {
    stopped = true;
  };
}
