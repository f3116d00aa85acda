// A topic's page: its figures, partitions and subscriptions (with cursor actions), compaction,
// termination and deletion; its ledgers and cursors (internalStats); and, in their own modules,
// its messages, a live tail, peeking at a subscription and its schema.

import { del, get, post, put, topicPaths } from "./api.js";
import {
  button, errorBox, field, fmtByteRate, fmtBytes, fmtCount, fmtRate, fmtTime, h, link, loading, panel, parseTime,
  replace, stat, table,
} from "./dom.js";
import { messagesTab } from "./messages.js";
import { act } from "./namespaces.js";
import { peekPanel } from "./peek.js";
import { schemaTab } from "./schema.js";
import { nsHref, TOPIC_TABS, topicHref } from "./routes.js";
import { tailTab } from "./tail.js";

export const TOPIC_POLL_MS = 3000;
const PARTITION_SUFFIX = /-partition-(\d+)$/;
const TAB_LABELS = { overview: "Overview", messages: "Messages", tail: "Live tail", storage: "Ledgers",
  schema: "Schema" };

/**
 * What the page needs to know first: does the topic exist, and is it partitioned (into how
 * many)? Asked of the admin API, then of the range-read API (which answers a role that may only
 * consume too, and says 404 for a topic that does not exist); a role that may do neither (a
 * producer) still gets the page, as if the topic existed and were not partitioned.
 */
async function topicShape(tenant, namespace, topic) {
  const partitionMatch = PARTITION_SUFFIX.exec(topic);
  const partitionIndex = partitionMatch ? Number(partitionMatch[1]) : -1;
  const paths = topicPaths(tenant, namespace, topic);
  if (!partitionMatch) {
    try {
      const partitions = (await get(`${paths.admin}/partitions`)).partitions;
      if (partitions) return { partitions, partitionIndex };
    } catch {
      // a role without admin rights: the range-read API answers below
    }
  }
  try {
    const offsets = await get(`${paths.rest}/offsets`);
    return { partitions: partitionMatch ? 0 : offsets.partitions, partitionIndex };
  } catch (error) {
    if (error.status === 404) return { missing: error };
    return { partitions: 0, partitionIndex, unknown: error };
  }
}

/** The whole page of a topic that does not exist: one line, and the way to its namespace. */
function missingTopic(tenant, namespace, topic) {
  return h("p", { class: "missing-topic", role: "alert" },
    `persistent://${tenant}/${namespace}/${topic} does not exist. `,
    link(nsHref(tenant, namespace), `Back to namespace ${tenant}/${namespace}`),
    " (where topics are created).");
}

export function topicView(root, { tenant, namespace, topic, tab }) {
  const body = h("div", {}, loading());
  const partitionOf = PARTITION_SUFFIX.exec(topic);
  const parent = partitionOf ? topic.slice(0, partitionOf.index) : null;
  const tabs = h("nav", { class: "tabs", "aria-label": "Topic" }, TOPIC_TABS.map((t) => h("a", {
    href: topicHref(tenant, namespace, topic, t), class: t === tab ? "active" : null,
    "aria-current": t === tab ? "page" : null, dataset: { tab: t },
  }, TAB_LABELS[t])));
  replace(root,
    h("div", { class: "page-head" },
      h("p", { class: "crumbs" }, link(nsHref(tenant, namespace), `${tenant}/${namespace}`),
        parent ? [" / ", link(topicHref(tenant, namespace, parent), parent)] : null),
      h("h1", { class: "topic-title" }, topic)),
    tabs,
    body);
  let dispose = () => {};
  let stopped = false;
  topicShape(tenant, namespace, topic).then((shape) => {
    if (stopped) return;
    if (shape.missing) {
      tabs.remove();
      replace(body, missingTopic(tenant, namespace, topic));
      return;
    }
    const context = { tenant, namespace, topic, paths: topicPaths(tenant, namespace, topic), ...shape };
    const views = { overview: overviewTab, messages: messagesTab, tail: tailTab, storage: storageTab,
      schema: schemaTab };
    dispose = views[tab](body, context);
  });
  return () => {
    stopped = true;
    dispose();
  };
}

// --- overview tab ----------------------------------------------------------------------------
function statsFigures(stats, ctx) {
  return h("div", { class: "stats" },
    stat("In", fmtRate(stats.msgRateIn), stats.msgRateIn, "msgRateIn"),
    stat("Out", fmtRate(stats.msgRateOut), stats.msgRateOut, "msgRateOut"),
    stat("Bytes in", fmtByteRate(stats.msgThroughputIn), stats.msgThroughputIn, "msgThroughputIn"),
    stat("Bytes out", fmtByteRate(stats.msgThroughputOut), stats.msgThroughputOut, "msgThroughputOut"),
    stat("Storage", fmtBytes(stats.storageSize), stats.storageSize, "storageSize"),
    stat("Backlog size", fmtBytes(stats.backlogSize), stats.backlogSize, "backlogSize"),
    stat("Messages in", fmtCount(stats.msgInCounter), stats.msgInCounter, "msgInCounter"),
    stat("Producers", fmtCount(stats.publishers.length), stats.publishers.length, "producers"),
    ctx.partitions ? stat("Partitions", fmtCount(ctx.partitions), ctx.partitions, "partitions")
      : stat("Offsets", `${fmtCount(stats.firstOffset)} – ${fmtCount(stats.nextOffset)}`, stats.nextOffset,
        "offsets"),
    ctx.partitions ? null : stat("State", stats.terminated ? "terminated" : "open",
      stats.terminated ? "terminated" : "open", "state"),
    ctx.partitions ? null : stat("Deduplication", stats.deduplicationStatus, stats.deduplicationStatus, "dedup"));
}

function partitionsTable(ctx, partitions) {
  const rows = Object.entries(partitions).map(([name, stats]) => ({ name, stats }));
  return table([
    { label: "Partition", value: (r) => {
      const local = r.name.split("/").pop();
      return link(topicHref(ctx.tenant, ctx.namespace, local), local);
    } },
    { label: "In", class: "num", value: (r) => fmtRate(r.stats.msgRateIn) },
    { label: "Out", class: "num", value: (r) => fmtRate(r.stats.msgRateOut) },
    { label: "Storage", class: "num", value: (r) => fmtBytes(r.stats.storageSize) },
    { label: "Next offset", class: "num", value: (r) => fmtCount(r.stats.nextOffset) },
    { label: "State", value: (r) => (r.stats.terminated ? "terminated" : "open") },
  ], rows, { empty: "No partition has been written yet." });
}

/** A subscription's consumers, as the topic's stats give them (Pulsar's ConsumerStats). */
function consumersTable(name, consumers) {
  return h("div", { class: "consumers", dataset: { consumersOf: name } },
    h("h3", {}, `Consumers of ${name}`),
    table([
      { label: "Name", value: (c) => c.consumerName },
      { label: "Address", class: "mono", value: (c) => (c.address ? c.address.replace(/^\//, "")
        : h("span", { class: "muted" }, "no connection (REST pull)")) },
      { label: "Connected since", value: (c) => (c.connectedSince ? fmtTime(Date.parse(c.connectedSince)) : "–") },
      { label: "Permits", class: "num", value: (c) => fmtCount(c.availablePermits) },
      { label: "Unacked", class: "num", value: (c) => fmtCount(c.unackedMessages) },
      { label: "Out", class: "num", value: (c) => fmtRate(c.msgRateOut) },
      { label: "Bytes out", class: "num", value: (c) => fmtByteRate(c.msgThroughputOut) },
      { label: "Blocked", value: (c) => (c.blockedConsumerOnUnackedMsgs ? "on unacked" : "no") },
    ], consumers, { empty: "No consumer is connected.",
      rowAttrs: (c) => ({ dataset: { consumer: c.consumerName } }) }));
}

/** The subscriptions, each with a button that shows its consumers below (kept across refreshes). */
function subscriptionsTable(subscriptions, expanded, toggle) {
  const rows = Object.entries(subscriptions).map(([name, s]) => ({ name, ...s }));
  const consumersCell = (s) => button(`${fmtCount(s.consumers.length)} ${expanded.has(s.name) ? "▾" : "▸"}`,
    () => toggle(s.name), { class: "small consumers-toggle", "aria-expanded": String(expanded.has(s.name)),
      title: `Consumers of ${s.name}` });
  return [table([
    { label: "Subscription", value: (s) => s.name },
    { label: "Type", value: (s) => s.type || h("span", { class: "muted" }, "no consumer") },
    { label: "Backlog", class: "num", value: (s) => fmtCount(s.msgBacklog) },
    { label: "Backlog size", class: "num", value: (s) => fmtBytes(s.backlogSize) },
    { label: "Consumers", class: "num", value: consumersCell },
    { label: "Unacked", class: "num", value: (s) => fmtCount(s.unackedMessages) },
    { label: "Out", class: "num", value: (s) => fmtRate(s.msgRateOut) },
    { label: "Redelivery", class: "num", value: (s) => fmtRate(s.msgRateRedeliver) },
    { label: "Redelivered", class: "num", value: (s) => fmtCount(s.msgRedeliverCounter) },
  ], rows, { empty: "No subscriptions.", rowAttrs: (s) => ({ dataset: { subscription: s.name } }) }),
  rows.filter((s) => expanded.has(s.name)).map((s) => consumersTable(s.name, s.consumers))];
}

function localTimeText(ms) {
  return fmtTime(ms).slice(0, 19);
}

function subscriptionActions(ctx, refresh) {
  const admin = ctx.paths.admin;
  const slot = h("div", { class: "action-slot" });
  const select = h("select", { name: "subscription" });
  const newName = h("input", { name: "newSubscription", placeholder: "name", autocomplete: "off" });
  const initial = h("select", { name: "initialPosition" }, h("option", { value: "latest" }, "latest"),
    h("option", { value: "earliest" }, "earliest"));
  const time = h("input", { name: "resetTime", value: localTimeText(Date.now() - 3600 * 1000), autocomplete: "off" });
  const messageId = h("input", { name: "resetMessageId", placeholder: "ledger:entry[:partition[:batch]] or base64",
    autocomplete: "off" });
  const skipCount = h("input", { type: "number", name: "skipCount", min: 1, step: 1, value: "1" });
  const force = h("input", { type: "checkbox", name: "forceDelete" });
  const sub = () => encodeURIComponent(select.value);
  const need = (action) => () => {
    if (!select.value) {
      replace(slot, errorBox({ code: "no_subscription", message: "Choose a subscription first." }));
      return undefined;
    }
    return action();
  };
  const run = (action, done) => act(slot, action, done).then(refresh);

  function update(names) {
    const chosen = select.value;
    replace(select, names.length ? names.map((n) => h("option", { value: n }, n))
      : h("option", { value: "" }, "no subscriptions"));
    if (names.includes(chosen)) select.value = chosen;
  }

  const resetTime = need(() => run(async () => {
    const ms = parseTime(time.value);
    await post(`${admin}/subscription/${sub()}/resetcursor/${ms}`);
    return ms;
  }, (ms) => `${select.value} reset to messages published from ${fmtTime(ms)} on.`));

  const resetMessageId = need(() => run(async () => {
    const found = await get(`${ctx.paths.rest}/offsetOf`, { messageId: messageId.value.trim() });
    await post(`${admin}/subscription/${sub()}/resetcursor`, found.messageId);
    return found;
  }, (found) => `${select.value} reset to offset ${found.offset} of ${found.topic}.`));

  const skip = need(() => run(() => post(`${admin}/subscription/${sub()}/skip/${Number(skipCount.value)}`),
    `Skipped ${skipCount.value} messages of ${select.value}.`));

  const clear = need(() => {
    if (!confirm(`Clear the backlog of ${select.value}? Every message is acknowledged.`)) return undefined;
    return run(() => post(`${admin}/subscription/${sub()}/skip_all`), `Cleared the backlog of ${select.value}.`);
  });

  const remove = need(() => {
    if (!confirm(`Delete subscription ${select.value}?`)) return undefined;
    return run(() => del(`${admin}/subscription/${sub()}`, { force: String(force.checked) }),
      `Deleted subscription ${select.value}.`);
  });

  const peek = peekPanel(ctx, () => need(() => select.value)() || "");

  function create(event) {
    event.preventDefault();
    const name = newName.value.trim();
    run(() => put(`${admin}/subscription/${encodeURIComponent(name)}`, initial.value),
      `Created subscription ${name} at the ${initial.value} message.`);
  }

  const element = panel("Subscription actions",
    h("div", { class: "form-row" }, field("Subscription", select)),
    h("div", { class: "action-grid" },
      h("form", { class: "form-row", onsubmit: (e) => { e.preventDefault(); resetTime(); } },
        field("Reset to time", time, "local time, or epoch ms"), h("button", { type: "submit" }, "Reset")),
      h("form", { class: "form-row", onsubmit: (e) => { e.preventDefault(); resetMessageId(); } },
        field("Reset to message id", messageId), h("button", { type: "submit" }, "Reset")),
      h("form", { class: "form-row", onsubmit: (e) => { e.preventDefault(); skip(); } },
        field("Skip messages", skipCount), h("button", { type: "submit" }, "Skip")),
      h("div", { class: "form-row" },
        button("Clear backlog", clear, { class: "warn" }),
        h("label", { class: "check" }, force, "force"),
        button("Delete subscription", remove, { class: "danger" }))),
    ctx.partitions ? h("p", { class: "muted" }, "Peek at a partition's subscription: open a partition above.")
      : [peek.form, peek.element],
    h("form", { class: "form-row", onsubmit: create },
      field("New subscription", newName), field("Starting at", initial),
      h("button", { type: "submit" }, "Create subscription")),
    slot);
  return { element, update };
}

function lifecyclePanel(ctx) {
  const admin = ctx.paths.admin;
  const slot = h("div", { class: "action-slot" });
  const compaction = h("div", {});

  async function loadCompaction() {
    if (ctx.partitions) return;
    try {
      const c = await get(`${admin}/compaction`);
      replace(compaction, h("div", { class: "stats" },
        stat("Compaction", c.status, c.status, "compactionStatus"),
        stat("Last run", c.lastRunTimestamp ? fmtTime(c.lastRunTimestamp) : "never", c.lastRunTimestamp, "compactionRun"),
        stat("Kept messages", fmtCount(c.messages), c.messages, "compactionMessages"),
        stat("Horizon offset", c.horizonOffset >= 0 ? fmtCount(c.horizonOffset) : "–", c.horizonOffset,
          "compactionHorizon")),
        c.lastError ? h("div", { class: "error" }, h("strong", {}, "last error"), " ", c.lastError) : null);
    } catch (error) {
      replace(compaction, errorBox(error));
    }
  }

  const compact = () => act(slot, () => put(`${admin}/compaction`), "Compaction started.").then(loadCompaction);

  function terminate() {
    if (!confirm(`Terminate ${ctx.topic}? It will accept no more messages, ever.`)) return;
    act(slot, () => post(`${admin}/terminate`),
      (last) => `Terminated; the last message is ${last.ledgerId}:${last.entryId}.`);
  }

  function remove() {
    if (!confirm(`Delete ${ctx.topic} and its subscriptions (consumers are disconnected)?`)) return;
    const target = ctx.partitions ? `${admin}/partitions` : admin;
    act(slot, () => del(target, { force: "true" }), "Deleted.").then((done) => {
      if (done !== undefined) location.hash = nsHref(ctx.tenant, ctx.namespace);
    });
  }

  loadCompaction();
  const single = ctx.partitions === 0;
  return {
    refresh: loadCompaction,
    element: panel("Lifecycle",
      single ? compaction : h("p", { class: "muted" },
        "Compaction and termination apply to each partition: open a partition above."),
      h("div", { class: "form-row" },
        single ? button("Compact now", compact) : null,
        single ? button("Terminate", terminate, { class: "warn" }) : null,
        button("Delete topic", remove, { class: "danger" })),
      slot),
  };
}

function overviewTab(root, ctx) {
  const figures = h("div", {}, loading());
  const partitions = h("div", {});
  const subscriptions = h("div", {}, loading());
  let timer = null;
  let stopped = false;
  const actions = subscriptionActions(ctx, () => refresh());
  const lifecycle = lifecyclePanel(ctx);
  const expanded = new Set();
  let lastStats = null;
  const showSubscriptions = () => replace(subscriptions,
    subscriptionsTable(lastStats.subscriptions, expanded, (name) => {
      if (!expanded.delete(name)) expanded.add(name);
      showSubscriptions();
    }));

  async function refresh() {
    clearTimeout(timer);
    try {
      const stats = ctx.partitions ? await get(`${ctx.paths.admin}/partitioned-stats`, { perPartition: "true" })
        : await get(`${ctx.paths.admin}/stats`);
      if (stopped) return;
      replace(figures, statsFigures(stats, ctx));
      actions.element.hidden = false;
      lifecycle.element.hidden = false;
      if (ctx.partitions) replace(partitions, panel("Partitions", partitionsTable(ctx, stats.partitions)));
      lastStats = stats;
      showSubscriptions();
      actions.update(Object.keys(stats.subscriptions).sort());
    } catch (error) {
      if (stopped) return;
      replace(figures, errorBox(error),
        error.status === 403 ? h("p", { class: "muted" }, "Statistics need a tenant admin; the Messages and " +
          "Live tail tabs need only the produce or consume permission.") : null);
      replace(subscriptions, errorBox(error));
      // Every action here needs what the statistics need: a role refused those sees no buttons.
      actions.element.hidden = error.status === 401 || error.status === 403;
      lifecycle.element.hidden = actions.element.hidden;
    }
    if (!stopped) timer = setTimeout(refresh, TOPIC_POLL_MS);
  }

  replace(root, panel(null, figures), partitions, panel("Subscriptions", subscriptions), actions.element,
    lifecycle.element);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// --- ledgers tab -----------------------------------------------------------------------------
function internalStatsView(stats) {
  const cursors = Object.entries(stats.cursors).map(([name, c]) => ({ name, ...c }));
  return [
    h("div", { class: "stats" },
      stat("State", stats.state, stats.state, "mlState"),
      stat("Entries", fmtCount(stats.numberOfEntries), stats.numberOfEntries, "entries"),
      stat("Size", fmtBytes(stats.totalSize), stats.totalSize, "totalSize"),
      stat("Last confirmed", stats.lastConfirmedEntry, stats.lastConfirmedEntry, "lastConfirmed"),
      stat("Offsets", `${fmtCount(stats.firstOffset)} – ${fmtCount(stats.nextOffset)}`, stats.nextOffset, "offsets"),
      stat("Current ledger", `${fmtCount(stats.currentLedgerEntries)} entries · ${fmtBytes(stats.currentLedgerSize)}`,
        stats.currentLedgerEntries, "currentLedger"),
      stats.compactedLedger ? stat("Compacted ledger", String(stats.compactedLedger.ledgerId),
        stats.compactedLedger.ledgerId, "compactedLedger") : null,
      stats.offload && stats.offload.status !== "NOT_RUN" ? stat("Offload", stats.offload.status,
        stats.offload.status, "offload") : null),
    stats.offload && stats.offload.lastError ? h("div", { class: "error", role: "alert", dataset: { offloadError: "" } },
      h("strong", {}, "The last offload failed:"), " ",
      h("span", { class: "error-message" }, stats.offload.lastError)) : null,
    h("h3", {}, "Ledgers"),
    table([
      { label: "Ledger", class: "num", value: (l) => String(l.ledgerId) },
      { label: "Entries", class: "num", value: (l) => fmtCount(l.entries) },
      { label: "Messages", class: "num", value: (l) => fmtCount(l.messages) },
      { label: "First offset", class: "num", value: (l) => fmtCount(l.firstOffset) },
      { label: "Size", class: "num", value: (l) => fmtBytes(l.size) },
      { label: "Stored", value: (l) => (l.offloaded ? (l.bookkeeperDeleted ? "offloaded" : "offloaded + local") : "local") },
    ], stats.ledgers, { empty: "No ledgers." }),
    h("h3", {}, "Cursors"),
    table([
      { label: "Cursor", value: (c) => c.name },
      { label: "Mark-delete", value: (c) => `${c.markDeletePosition} (offset ${fmtCount(c.markDeleteOffset)})` },
      { label: "Read position", value: (c) => `${c.readPosition} (offset ${fmtCount(c.readOffset)})` },
      { label: "Acked ranges", class: "num", value: (c) => fmtCount(c.totalNonContiguousDeletedMessagesRange) },
      { label: "Consumed", class: "num", value: (c) => fmtCount(c.messagesConsumedCounter) },
      { label: "Cursor ledger", class: "num", value: (c) => String(c.cursorLedger) },
      { label: "Active", value: (c) => (c.active ? "yes" : "no") },
    ], cursors, { empty: "No cursors." }),
  ];
}

function storageTab(root, ctx) {
  const content = h("div", {}, loading());
  const partition = h("select", { name: "partition" },
    Array.from({ length: ctx.partitions }, (_, i) => h("option", { value: String(i) }, `partition ${i}`)));
  let stopped = false;

  async function load() {
    const target = ctx.partitions ? topicPaths(ctx.tenant, ctx.namespace, `${ctx.topic}-partition-${partition.value}`)
      : ctx.paths;
    replace(content, loading());
    try {
      const stats = await get(`${target.admin}/internalStats`);
      if (!stopped) replace(content, internalStatsView(stats));
    } catch (error) {
      if (!stopped) replace(content, errorBox(error));
    }
  }

  partition.addEventListener("change", load);
  replace(root, panel("Ledgers and cursors (internalStats)",
    ctx.partitions ? h("div", { class: "form-row" }, field("Partition", partition), button("Refresh", load))
      : h("div", { class: "form-row" }, button("Refresh", load)),
    content));
  load();
  return () => {
    stopped = true;
  };
}
