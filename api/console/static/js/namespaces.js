// Tenants and namespaces: the tenant list with namespaces (superuser), and a namespace's page:
// its topics with rates and counts, topic creation and deletion, policies and permissions.

import { del, get, namespacePaths, post, put, request, topicPaths } from "./api.js";
import {
  button, errorBox, field, fmtByteRate, fmtBytes, fmtCount, fmtRate, h, link, loading, notice, panel, replace, table,
} from "./dom.js";
import { nsHref, topicHref } from "./routes.js";

export const TOPICS_POLL_MS = 3000;
export const TOPICS_PAGE_ROWS = 20;

/** Run an action and report it in `slot`: the API's error, or `done`. */
export async function act(slot, action, done) {
  replace(slot, h("p", { class: "muted" }, "Working…"));
  try {
    const result = await action();
    replace(slot, notice(typeof done === "function" ? done(result) : done));
    return result;
  } catch (error) {
    replace(slot, errorBox(error));
    return undefined;
  }
}

// --- tenants ---------------------------------------------------------------------------------
export function tenantsView(root) {
  const list = h("div", {}, loading());
  const slot = h("div", { class: "action-slot" });
  const tenantName = h("input", { name: "tenant", placeholder: "tenant", required: true, autocomplete: "off" });
  const adminRoles = h("input", { name: "adminRoles", placeholder: "role-a, role-b", autocomplete: "off" });
  const nsTenant = h("input", { name: "nsTenant", placeholder: "tenant", autocomplete: "off" });
  const nsName = h("input", { name: "namespace", placeholder: "namespace", autocomplete: "off" });

  async function load() {
    try {
      const tenants = await get("/admin/v2/tenants");
      const rows = await Promise.all(tenants.map(async (tenant) => {
        try {
          return { tenant, namespaces: await get(`/admin/v2/namespaces/${encodeURIComponent(tenant)}`) };
        } catch (error) {
          return { tenant, error };
        }
      }));
      replace(list, table([
        { label: "Tenant", value: (r) => r.tenant },
        { label: "Namespaces", value: (r) => (r.error ? errorBox(r.error)
          : r.namespaces.length ? h("ul", { class: "inline-list" }, r.namespaces.map((ns) => {
            const [t, n] = ns.split("/");
            return h("li", {}, link(nsHref(t, n), ns));
          })) : h("span", { class: "muted" }, "none")) },
        { label: "", class: "actions", value: (r) => button("Delete tenant", () => {
          if (!confirm(`Delete tenant ${r.tenant}? It must have no namespaces.`)) return;
          act(slot, () => del(`/admin/v2/tenants/${encodeURIComponent(r.tenant)}`), `Tenant ${r.tenant} deleted.`)
            .then(load);
        }, { class: "danger small" }) },
      ], rows, { empty: "No tenants.", rowAttrs: (r) => ({ dataset: { tenant: r.tenant } }) }));
    } catch (error) {
      replace(list, errorBox(error),
        error.status === 403 ? h("p", { class: "muted" }, "Listing tenants needs a superuser. Open a namespace " +
          "you administer with the box at the top.") : null);
    }
  }

  function createTenant(event) {
    event.preventDefault();
    const roles = adminRoles.value.split(",").map((r) => r.trim()).filter(Boolean);
    act(slot, () => put(`/admin/v2/tenants/${encodeURIComponent(tenantName.value.trim())}`,
      { adminRoles: roles, allowedClusters: ["standalone"] }), `Tenant ${tenantName.value.trim()} created.`)
      .then(load);
  }

  function createNamespace(event) {
    event.preventDefault();
    const tenant = nsTenant.value.trim();
    const namespace = nsName.value.trim();
    act(slot, () => put(namespacePaths(tenant, namespace).admin), `Namespace ${tenant}/${namespace} created.`)
      .then(load);
  }

  replace(root,
    h("div", { class: "page-head" }, h("h1", {}, "Tenants and namespaces")),
    panel(null, list),
    panel("Create",
      h("form", { class: "form-row", onsubmit: createTenant },
        field("Tenant", tenantName), field("Admin roles", adminRoles, "comma-separated"),
        h("button", { type: "submit" }, "Create tenant")),
      h("form", { class: "form-row", onsubmit: createNamespace },
        field("Tenant", nsTenant), field("Namespace", nsName), h("button", { type: "submit" }, "Create namespace")),
      slot));
  load();
  return () => {};
}

// --- a namespace -----------------------------------------------------------------------------
function topicsTable(tenant, namespace, rows, { onDelete, empty }) {
  return table([
    { label: "Topic", value: (t) => link(topicHref(tenant, namespace, t.localName), t.localName) },
    { label: "Partitions", class: "num", value: (t) => (t.partitions ? fmtCount(t.partitions) : "–") },
    { label: "In", class: "num", value: (t) => fmtRate(t.msgRateIn) },
    { label: "Out", class: "num", value: (t) => fmtRate(t.msgRateOut) },
    { label: "Bytes in", class: "num", value: (t) => fmtByteRate(t.msgThroughputIn) },
    { label: "Bytes out", class: "num", value: (t) => fmtByteRate(t.msgThroughputOut) },
    { label: "Storage", class: "num", value: (t) => fmtBytes(t.storageSize) },
    { label: "Backlog", class: "num", value: (t) => fmtCount(t.backlog) },
    { label: "Producers", class: "num", value: (t) => fmtCount(t.producers) },
    { label: "Subscriptions", class: "num", value: (t) => fmtCount(t.subscriptions) },
    { label: "Consumers", class: "num", value: (t) => fmtCount(t.consumers) },
    { label: "", class: "actions", value: (t) => button("Delete", () => onDelete(t), { class: "danger small" }) },
  ], rows, { empty, rowAttrs: (t) => ({ dataset: { topic: t.localName } }) });
}

// What a retention or TTL value means, in words (the form shows the number the API returns).
export function retentionWords(minutes, megabytes) {
  const time = minutes < 0 ? "unlimited time" : minutes === 0 ? "nothing consumed kept by time" : `${minutes} min`;
  const size = megabytes < 0 ? "unlimited size" : megabytes === 0 ? "nothing consumed kept by size"
    : `${megabytes} MB`;
  return `${time}, ${size}`;
}

const ttlWords = (seconds) => (seconds > 0 ? `messages expire after ${seconds} s` : "messages never expire");

// A bound of retention (-1 unlimited) as a number to compare: a smaller one keeps less.
const bound = (value) => (typeof value === "number" && value < 0 ? Infinity : value);
const keepsLess = (before, after) => typeof after === "number" && bound(after) < bound(before);

function policiesPanel(tenant, namespace) {
  const paths = namespacePaths(tenant, namespace);
  const body = h("div", {}, loading());
  const slot = h("div", { class: "action-slot" });
  const minutes = h("input", { type: "number", min: -1, step: 1, name: "retentionMinutes" });
  const megabytes = h("input", { type: "number", min: -1, step: 1, name: "retentionMB" });
  const retentionMeaning = h("span", { class: "field-hint", dataset: { meaning: "retention" } });
  const ttl = h("input", { type: "number", min: 0, step: 1, name: "ttlSeconds" });
  const ttlMeaning = h("span", { class: "field-hint", dataset: { meaning: "ttl" } });
  const dedup = h("select", { name: "dedup" }, h("option", { value: "" }, "broker default"),
    h("option", { value: "true" }, "on"), h("option", { value: "false" }, "off"));
  // What the broker holds now: a save compares against it, so pressing Save changes nothing
  // unless a value was edited, and a value that keeps less data is confirmed first.
  let held = { minutes: -1, megabytes: -1, own: false, ttl: 0 };
  const useDefault = button("Use the broker's default", () => useDefaultRetention(), { name: "retentionDefault" });

  const number = (input) => (input.value.trim() === "" ? input.value : Number(input.value));
  const describe = () => {
    const [m, mb] = [number(minutes), number(megabytes)];
    retentionMeaning.textContent = typeof m === "number" && typeof mb === "number"
      ? `${retentionWords(m, mb)}${held.own ? " (set on this namespace)" : " (the broker's default)"}` : "";
    useDefault.hidden = !held.own;
    ttlMeaning.textContent = typeof number(ttl) === "number" ? ttlWords(number(ttl)) : "";
  };
  minutes.addEventListener("input", describe);
  megabytes.addEventListener("input", describe);
  ttl.addEventListener("input", describe);

  async function load() {
    try {
      const [policies, retention] = await Promise.all([get(paths.admin), get(`${paths.admin}/retention`)]);
      held = { minutes: retention.retentionTimeInMinutes, megabytes: retention.retentionSizeInMB,
        own: Boolean(policies.retention_policies), ttl: policies.message_ttl_in_seconds || 0 };
      minutes.value = held.minutes;
      megabytes.value = held.megabytes;
      ttl.value = held.ttl;
      dedup.value = policies.deduplicationEnabled === null || policies.deduplicationEnabled === undefined ? ""
        : String(policies.deduplicationEnabled);
      describe();
      replace(body,
        h("form", { class: "form-row", onsubmit: (e) => { e.preventDefault(); saveRetention(); } },
          field("Retention time (min)", minutes, "-1 unlimited, 0 keep nothing consumed"),
          field("Retention size (MB)", megabytes, "-1 unlimited"), h("button", { type: "submit" }, "Save retention"),
          useDefault),
        retentionMeaning,
        h("form", { class: "form-row", onsubmit: (e) => { e.preventDefault(); saveTtl(); } },
          field("Message TTL (s)", ttl, "0: messages never expire"), h("button", { type: "submit" }, "Save TTL")),
        ttlMeaning,
        h("form", { class: "form-row", onsubmit: (e) => { e.preventDefault(); saveDedup(); } },
          field("Deduplication", dedup, "applies to topics loaded from now on"),
          h("button", { type: "submit" }, "Save deduplication")));
    } catch (error) {
      replace(body, errorBox(error));
    }
  }

  const unchanged = (text) => replace(slot, notice(text));
  const saveRetention = async () => {
    const [m, mb] = [number(minutes), number(megabytes)];
    if (m === held.minutes && mb === held.megabytes) return unchanged("Retention unchanged: nothing to save.");
    if ((keepsLess(held.minutes, m) || keepsLess(held.megabytes, mb)) && !window.confirm(
      `Keep ${retentionWords(m, mb)} instead of ${retentionWords(held.minutes, held.megabytes)}? Consumed `
      + "messages beyond the new bound will be deleted for good.")) return unchanged("Retention not changed.");
    if (await act(slot, () => post(`${paths.admin}/retention`, { retentionTimeInMinutes: m, retentionSizeInMB: mb }),
      "Retention saved.") !== undefined) {
      held = { ...held, minutes: m, megabytes: mb, own: true };
      describe();
    }
  };
  const useDefaultRetention = async () => {
    if (!window.confirm("Remove this namespace's retention? The broker's default applies again, which may keep "
      + "less.")) return unchanged("Retention not changed.");
    if (await act(slot, () => del(`${paths.admin}/retention`), "Retention removed: the broker's default applies.")
      !== undefined) load();
  };
  const saveTtl = async () => {
    const seconds = number(ttl);
    if (seconds === held.ttl) return unchanged("TTL unchanged: nothing to save.");
    if (typeof seconds === "number" && seconds > 0 && (held.ttl === 0 || seconds < held.ttl) && !window.confirm(
      `Messages older than ${seconds} s will expire: every subscription skips them, and retention may then `
      + "delete them. Continue?")) return unchanged("TTL not changed.");
    if (await act(slot, () => (seconds === 0 ? del(`${paths.admin}/messageTTL`)
      : post(`${paths.admin}/messageTTL`, seconds)), "Message TTL saved.") !== undefined) {
      held = { ...held, ttl: seconds };
      describe();
    }
  };
  const saveDedup = () => act(slot, () => (dedup.value === "" ? del(`${paths.admin}/deduplication`)
    : post(`${paths.admin}/deduplication`, dedup.value === "true")), "Deduplication saved.");

  load();
  return panel("Policies", body, slot);
}

function permissionsPanel(tenant, namespace) {
  const paths = namespacePaths(tenant, namespace);
  const body = h("div", {}, loading());
  const slot = h("div", { class: "action-slot" });
  const role = h("input", { name: "role", placeholder: "role", autocomplete: "off" });
  const produce = h("input", { type: "checkbox", name: "produce", checked: true });
  const consume = h("input", { type: "checkbox", name: "consume", checked: true });

  async function load() {
    try {
      const grants = await get(`${paths.admin}/permissions`);
      replace(body, table([
        { label: "Role", value: (r) => r[0] },
        { label: "Actions", value: (r) => r[1].join(", ") },
        { label: "", class: "actions", value: (r) => button("Revoke", () => act(slot,
          () => del(`${paths.admin}/permissions/${encodeURIComponent(r[0])}`), `Role ${r[0]} revoked.`).then(load),
        { class: "danger small" }) },
      ], Object.entries(grants), { empty: "No role has a grant here (superusers and tenant admins need none)." }));
    } catch (error) {
      replace(body, errorBox(error));
    }
  }

  function grant(event) {
    event.preventDefault();
    const actions = [produce.checked ? "produce" : null, consume.checked ? "consume" : null].filter(Boolean);
    act(slot, () => post(`${paths.admin}/permissions/${encodeURIComponent(role.value.trim())}`, actions),
      `Granted ${actions.join(", ") || "nothing"} to ${role.value.trim()}.`).then(load);
  }

  load();
  return panel("Permissions", body,
    h("form", { class: "form-row", onsubmit: grant }, field("Role", role),
      h("label", { class: "check" }, produce, "produce"), h("label", { class: "check" }, consume, "consume"),
      h("button", { type: "submit" }, "Grant")),
    slot);
}

export function namespaceView(root, { tenant, namespace }) {
  const paths = namespacePaths(tenant, namespace);
  const topics = h("div", { class: "topics-slot" }, loading());
  const slot = h("div", { class: "action-slot" });
  const name = h("input", { name: "topic", placeholder: "topic name", autocomplete: "off", required: true });
  const partitions = h("input", { type: "number", name: "partitions", min: 0, step: 1, value: "0" });
  const force = h("input", { type: "checkbox", name: "force" });
  let timer = null;
  let stopped = false;

  // The topics the last poll listed, filtered by name and shown a page at a time; the filter
  // and the pager stay in place (and keep the focus) while the list under them is refreshed.
  const filter = h("input", { name: "topicFilter", type: "search", placeholder: "filter by name", autocomplete: "off" });
  const summary = h("span", { class: "muted topics-summary" });
  const previous = button("◀ Previous", () => { first -= TOPICS_PAGE_ROWS; render(); });
  const next = button("Next ▶", () => { first += TOPICS_PAGE_ROWS; render(); });
  const list = h("div", {}, loading());
  replace(topics, h("div", { class: "form-row" }, field("Filter", filter), previous, next, summary), list);
  let listed = null;
  let first = 0;

  function render() {
    if (!listed) return;
    const words = filter.value.trim().toLowerCase();
    const matching = listed.topics.filter((t) => t.localName.toLowerCase().includes(words))
      .sort((a, b) => (a.localName < b.localName ? -1 : a.localName > b.localName ? 1 : 0));
    first = Math.max(0, Math.min(first, Math.floor((matching.length - 1) / TOPICS_PAGE_ROWS) * TOPICS_PAGE_ROWS));
    const shown = matching.slice(first, first + TOPICS_PAGE_ROWS);
    const of = words ? `${matching.length} matching "${filter.value.trim()}" of ${listed.topics.length}`
      : `${matching.length}`;
    previous.disabled = first === 0;
    next.disabled = first + TOPICS_PAGE_ROWS >= matching.length;
    summary.textContent = shown.length ? `topics ${first + 1} – ${first + shown.length} of ${of}`
      : `none of ${listed.topics.length}`;
    replace(list,
      topicsTable(tenant, namespace, shown, { onDelete: deleteTopic,
        empty: words ? `No topic matches "${filter.value.trim()}".` : "No topics yet." }),
      listed.truncated ? h("p", { class: "muted" }, `The broker listed the first ${listed.topics.length} topics.`)
        : null);
  }

  filter.addEventListener("input", () => {
    first = 0;
    render();
  });

  async function poll() {
    clearTimeout(timer);
    try {
      const data = await get(paths.stats);
      if (stopped) return;
      listed = data;
      render();
    } catch (error) {
      if (stopped) return;
      replace(list, errorBox(error));
    }
    if (!stopped) timer = setTimeout(poll, TOPICS_POLL_MS);
  }

  function deleteTopic(row) {
    const how = force.checked ? " with its subscriptions (consumers are disconnected)" : "";
    if (!confirm(`Delete ${row.name}${how}?`)) return;
    const topic = topicPaths(tenant, namespace, row.localName).admin;
    const query = { force: String(force.checked) };
    act(slot, () => (row.partitions ? del(`${topic}/partitions`, query) : del(topic, query)),
      `Deleted ${row.name}.`).then(poll);
  }

  function createTopic(event) {
    event.preventDefault();
    const topic = topicPaths(tenant, namespace, name.value.trim()).admin;
    const count = Number(partitions.value || 0);
    const created = `persistent://${tenant}/${namespace}/${name.value.trim()}`;
    act(slot, () => (count > 0 ? request("PUT", `${topic}/partitions`, { json: count }) : put(topic)),
      count > 0 ? `Created ${created} with ${count} partitions.` : `Created ${created}.`).then(poll);
  }

  const deleteSlot = h("div", { class: "action-slot" });
  async function deleteNamespace() {
    if (!confirm(`Delete namespace ${tenant}/${namespace}? It must have no topics.`)) return;
    const done = await act(deleteSlot, () => del(paths.admin), `Namespace ${tenant}/${namespace} deleted.`);
    if (done === undefined) return;
    stopped = true;
    clearTimeout(timer);
    replace(root, h("div", { class: "page-head" }, h("h1", {}, `${tenant}/${namespace}`)),
      panel(null, deleteSlot, link("#/tenants", "Tenants and namespaces")));
  }

  replace(root,
    h("div", { class: "page-head" }, h("h1", {}, `${tenant}/${namespace}`), h("p", { class: "muted" }, "Namespace"),
      h("div", { class: "namespace-actions" }, button("Delete namespace", deleteNamespace, { class: "danger small" }),
        deleteSlot)),
    panel("Topics", topics,
      h("form", { class: "form-row", onsubmit: createTopic }, field("New topic", name),
        field("Partitions", partitions, "0: not partitioned"), h("button", { type: "submit" }, "Create topic")),
      h("label", { class: "check" }, force, "Delete with subscriptions (force)"),
      slot),
    h("div", { class: "two-columns" }, policiesPanel(tenant, namespace), permissionsPanel(tenant, namespace)));
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
