// The cluster: each cluster's brokers (GET /admin/v2/clusters, /admin/v2/brokers/{cluster}),
// the bookies (GET /admin/v2/bookies/all) and every namespace's bundles with their owner
// (/admin/v2/namespaces/{t}/{ns}/bundles and .../bundles/owners). A standalone broker refuses
// bundle owners (nothing is owned outside a cluster): each bundle row shows that refusal in the
// API's words rather than an owner it does not have.

import { get, namespacePaths } from "./api.js";
import { errorBox, h, link, loading, panel, replace, table } from "./dom.js";
import { nsHref } from "./routes.js";

export const NAMESPACES_SHOWN_MAX = 100;

const enc = encodeURIComponent;

async function brokerRows() {
  const clusters = await get("/admin/v2/clusters");
  const lists = await Promise.all(clusters.map(async (cluster) => ({
    cluster, brokers: await get(`/admin/v2/brokers/${enc(cluster)}`) })));
  return lists.flatMap(({ cluster, brokers }) => brokers.map((broker) => ({ cluster, broker })));
}

async function namespaceNames() {
  const tenants = await get("/admin/v2/tenants");
  const lists = await Promise.all(tenants.map((tenant) => get(`/admin/v2/namespaces/${enc(tenant)}`)));
  return lists.flat().sort();
}

/** One row per bundle of `namespace`: its range and its owner, or why the broker names none. */
async function bundleRows(namespace) {
  const [tenant, name] = namespace.split("/");
  const admin = namespacePaths(tenant, name).admin;
  const [bundles, owners] = await Promise.all([get(`${admin}/bundles`),
    get(`${admin}/bundles/owners`).catch((error) => ({ refused: error }))]);
  const ranges = bundles.boundaries.slice(1).map((end, i) => `${bundles.boundaries[i]}_${end}`);
  return ranges.map((bundle) => ({ namespace, tenant, name, bundle, owners }));
}

function ownerCell(row) {
  if (row.owners.refused) {
    return h("span", { class: "muted" }, `none: ${row.owners.refused.code}: ${row.owners.refused.message}`);
  }
  const owner = row.owners[row.bundle];
  return owner || h("span", { class: "muted" }, "unowned (the next lookup assigns it)");
}

async function fill(slot, load, render) {
  try {
    replace(slot, render(await load()));
  } catch (error) {
    replace(slot, errorBox(error));
  }
}

export function clusterView(root) {
  const brokers = h("div", {}, loading());
  const bookies = h("div", {}, loading());
  const bundles = h("div", {}, loading());
  replace(root,
    h("div", { class: "page-head" }, h("h1", {}, "Cluster")),
    h("div", { class: "two-columns" }, panel("Brokers", brokers), panel("Bookies", bookies)),
    panel("Namespace bundles", bundles));
  fill(brokers, brokerRows, (rows) => table([
    { label: "Cluster", value: (r) => r.cluster },
    { label: "Broker", class: "mono", value: (r) => r.broker },
  ], rows, { empty: "No broker is registered.", rowAttrs: (r) => ({ dataset: { broker: r.broker } }) }));
  fill(bookies, () => get("/admin/v2/bookies/all"), (answer) => table([
    { label: "Bookie", class: "mono", value: (b) => b.bookieId },
  ], answer.bookies, { empty: "No bookie is available.", rowAttrs: (b) => ({ dataset: { bookie: b.bookieId } }) }));
  fill(bundles, async () => {
    const names = await namespaceNames();
    const rows = await Promise.all(names.slice(0, NAMESPACES_SHOWN_MAX).map(bundleRows));
    return { rows: rows.flat(), total: names.length };
  }, ({ rows, total }) => [table([
    { label: "Namespace", value: (r) => link(nsHref(r.tenant, r.name), r.namespace) },
    { label: "Bundle", class: "mono", value: (r) => r.bundle },
    { label: "Owner", value: ownerCell },
  ], rows, { empty: "No namespaces.", rowAttrs: (r) => ({ dataset: { namespace: r.namespace, bundle: r.bundle } }) }),
  total > NAMESPACES_SHOWN_MAX ? h("p", { class: "muted" }, `Showing the first ${NAMESPACES_SHOWN_MAX} namespaces of ${total}.`)
    : null]);
  return () => {};
}
