// The overview: health, uptime, event-loop stalls, storage and broker-wide rates, polled from
// /admin/v2/broker-stats/overview; the charts begin with the broker's own last minutes of rates
// (the overview's ``history``) and go on with each poll.

import { get } from "./api.js";
import { TimeChart } from "./chart.js";
import {
  errorBox, fmtByteRate, fmtBytes, fmtCount, fmtDuration, fmtMicros, fmtRate, fmtRatio, h, loading, panel, replace,
  stat,
} from "./dom.js";

export const OVERVIEW_POLL_MS = 2000;
export const HISTORY_WINDOW_MS = 5 * 60 * 1000;
const HISTORY_POINTS_MAX = Math.ceil(HISTORY_WINDOW_MS / OVERVIEW_POLL_MS) + 1;

function group(title, ...stats) {
  return h("div", { class: "stat-group" }, h("h3", {}, title), h("div", { class: "stats" }, stats));
}

function trafficGroup(data) {
  return group("Traffic",
    stat("In", fmtRate(data.rates.msgRateIn), data.rates.msgRateIn, "msgRateIn"),
    stat("Out", fmtRate(data.rates.msgRateOut), data.rates.msgRateOut, "msgRateOut"),
    stat("Bytes in", fmtByteRate(data.rates.msgThroughputIn), data.rates.msgThroughputIn, "msgThroughputIn"),
    stat("Bytes out", fmtByteRate(data.rates.msgThroughputOut), data.rates.msgThroughputOut, "msgThroughputOut"),
    stat("Messages in", fmtCount(data.counters.msgInCounter), data.counters.msgInCounter, "msgInCounter"),
    stat("Messages out", fmtCount(data.counters.msgOutCounter), data.counters.msgOutCounter, "msgOutCounter"));
}

function eventLoopGroup(data) {
  const loop = data.eventLoop;
  const stall = loop.stallUs;
  const gcPauses = loop.gcPauses.reduce((sum, g) => sum + g.collections, 0);
  const gcUs = loop.gcPauses.reduce((sum, g) => sum + g.totalUs, 0);
  const oldest = loop.gcPauses.find((g) => g.generation === 2);
  return group("Event loop",
    stat("Stall p50", fmtMicros(stall.p50), stall.p50, "loopStallP50"),
    stat("Stall p99", fmtMicros(stall.p99), stall.p99, "loopStallP99"),
    stat("Stall p99.9", fmtMicros(stall.p999), stall.p999, "loopStallP999"),
    stat("Longest stall", fmtMicros(stall.max), stall.max, "loopStallMax"),
    stat("GC collections", `${fmtCount(gcPauses)} · ${fmtMicros(gcUs)}`, gcPauses, "gcCollections"),
    stat("Full GC p99", fmtMicros(oldest ? oldest.pauseUs.p99 : null), oldest ? oldest.pauseUs.p99 : null,
      "gcFullP99"));
}

function subscriptionsStat(data) {
  const count = data.subscriptions;
  const shown = count.total === null ? "counting…" : `${count.complete ? "" : "≥ "}${fmtCount(count.total)}`;
  return stat("Subscriptions", shown, count.total, "subscriptions");
}

function clusterGroups(data) {
  const c = data.cluster;
  const connected = c.bookies.filter((b) => b.connected).length;
  const recovery = c.autorecovery;
  return [
    group("Broker",
      stat("Health", data.status === "ok" ? "OK" : data.status, data.status, "health"),
      stat("Uptime", fmtDuration(data.uptimeSeconds), data.uptimeSeconds, "uptime"),
      stat("Topics loaded", fmtCount(data.loaded.topics), data.loaded.topics, "topics"),
      subscriptionsStat(data),
      stat("Consumers", fmtCount(data.loaded.consumers), data.loaded.consumers, "consumers")),
    trafficGroup(data),
    eventLoopGroup(data),
    group("Bookies",
      stat("Available", fmtCount(c.bookiesAvailable), c.bookiesAvailable, "bookiesAvailable"),
      stat("Connected", fmtCount(connected), connected, "bookiesConnected"),
      stat("Under-replicated ledgers", recovery ? fmtCount(recovery.underreplicatedLedgers) : "–",
        recovery ? recovery.underreplicatedLedgers : null, "underreplicated"),
      stat("Entries re-replicated", recovery ? fmtCount(recovery.entriesCopied) : "–",
        recovery ? recovery.entriesCopied : null, "entriesCopied")),
  ];
}

function render(data) {
  if (!data.storage) return clusterGroups(data);
  const s = data.storage;
  const j = s.journal;
  const latency = j.fsyncLatencyUs;
  const perFsync = j.fsyncs ? j.recordsWritten / j.fsyncs : null;
  return [
    group("Broker",
      stat("Health", data.status === "ok" ? "OK" : data.status, data.status, "health"),
      stat("Uptime", fmtDuration(data.uptimeSeconds), data.uptimeSeconds, "uptime"),
      stat("Storage", s.readOnly ? "read-only" : "writable", s.readOnly ? "read-only" : "writable", "readOnly"),
      stat("Topics loaded", fmtCount(data.loaded.topics), data.loaded.topics, "topics"),
      subscriptionsStat(data),
      stat("Consumers", fmtCount(data.loaded.consumers), data.loaded.consumers, "consumers")),
    trafficGroup(data),
    eventLoopGroup(data),
    group("Journal",
      stat("fsync p50", fmtMicros(latency.p50), latency.p50, "fsyncP50"),
      stat("fsync p99", fmtMicros(latency.p99), latency.p99, "fsyncP99"),
      stat("fsync p99.9", fmtMicros(latency.p999), latency.p999, "fsyncP999"),
      stat("fsyncs", fmtCount(j.fsyncs), j.fsyncs, "fsyncs"),
      stat("Records per fsync", perFsync === null ? "–" : perFsync.toFixed(1), perFsync, "recordsPerFsync"),
      stat("Queue depth", fmtCount(j.queueDepth), j.queueDepth, "journalQueue")),
    group("Caches",
      stat("Write cache", `${fmtBytes(s.writeCache.sizeBytes)} of ${fmtBytes(s.writeCache.capacityBytes)}`,
        s.writeCache.sizeBytes, "writeCacheBytes"),
      stat("Write cache hits", fmtRatio(s.writeCache.hitRatio), s.writeCache.hitRatio, "writeCacheHitRatio"),
      stat("Read cache", `${fmtBytes(s.readCache.sizeBytes)} of ${fmtBytes(s.readCache.capacityBytes)}`,
        s.readCache.sizeBytes, "readCacheBytes"),
      stat("Read cache hits", fmtRatio(s.readCache.hitRatio), s.readCache.hitRatio, "readCacheHitRatio"),
      stat("Entry cache hits", fmtRatio(data.entryCache.hitRatio), data.entryCache.hitRatio, "entryCacheHitRatio"),
      stat("Entry cache", fmtBytes(data.entryCache.sizeBytes), data.entryCache.sizeBytes, "entryCacheBytes")),
    group("Disk",
      stat("Entry logs", `${fmtCount(s.entryLogs.logs)} · ${fmtBytes(s.entryLogs.diskBytes)}`,
        s.entryLogs.diskBytes, "entryLogBytes"),
      stat("Index (RocksDB)", fmtBytes(s.index.sstBytes + s.index.memtableBytes),
        s.index.sstBytes + s.index.memtableBytes, "indexBytes"),
      stat("Ledgers", fmtCount(s.ledgers), s.ledgers, "ledgers"),
      stat("Journal files", fmtCount(j.files), j.files, "journalFiles"),
      stat("GC reclaimed", fmtBytes(s.gc.reclaimedBytes), s.gc.reclaimedBytes, "gcReclaimed"),
      stat("Flushes", fmtCount(s.flushes), s.flushes, "flushes"),
      stat("Flush p99", fmtMicros(s.flushLatencyUs.p99), s.flushLatencyUs.p99, "flushP99")),
  ];
}

export function overviewView(root) {
  const history = [];
  const figures = h("div", { class: "overview-figures" }, loading());
  let loaded = false;
  const status = h("div", { class: "status-slot" });
  const started = h("p", { class: "muted" });
  const messages = new TimeChart({
    title: "Messages per second", format: (v) => fmtRate(v, "").trim(), windowMs: HISTORY_WINDOW_MS,
    series: [{ key: "in", label: "in", color: "--series-in" }, { key: "out", label: "out", color: "--series-out" }],
  });
  const bytes = new TimeChart({
    title: "Bytes per second", format: (v) => fmtBytes(v), windowMs: HISTORY_WINDOW_MS, floor: 1024, binary: true,
    series: [{ key: "in", label: "in", color: "--series-in" }, { key: "out", label: "out", color: "--series-out" }],
  });
  replace(root,
    h("div", { class: "page-head" }, h("h1", {}, "Overview"), started),
    status,
    panel(null, h("div", { class: "charts" }, messages.element, bytes.element)),
    panel(null, figures));
  let timer = null;
  let stopped = false;

  async function poll() {
    try {
      const data = await get("/admin/v2/broker-stats/overview");
      if (stopped) return;
      replace(status);
      replace(started, `Up since ${new Date(data.startedAt).toLocaleString()}`);
      replace(figures, render(data));
      if (!loaded) {  // the minutes before the page opened, as the broker sampled them
        for (const s of data.history || []) {
          if (s.timestamp < data.timestamp) {
            history.push({ t: s.timestamp, msgIn: s.msgRateIn, msgOut: s.msgRateOut, bytesIn: s.msgThroughputIn,
              bytesOut: s.msgThroughputOut });
          }
        }
      }
      loaded = true;
      history.push({ t: data.timestamp, msgIn: data.rates.msgRateIn, msgOut: data.rates.msgRateOut,
        bytesIn: data.rates.msgThroughputIn, bytesOut: data.rates.msgThroughputOut });
      if (history.length > HISTORY_POINTS_MAX) history.splice(0, history.length - HISTORY_POINTS_MAX);
      messages.setPoints(history.map((p) => ({ t: p.t, in: p.msgIn, out: p.msgOut })));
      bytes.setPoints(history.map((p) => ({ t: p.t, in: p.bytesIn, out: p.bytesOut })));
    } catch (error) {
      if (stopped) return;
      const hint = error.status === 403
        ? h("p", { class: "muted" }, "The overview needs a superuser. Open a namespace or topic you may use " +
          "with the box at the top.") : null;
      replace(status, errorBox(error), hint);
      if (!loaded) replace(figures, h("p", { class: "muted" }, "No figures to show."));
    }
    if (!stopped) timer = setTimeout(poll, OVERVIEW_POLL_MS);
  }

  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    messages.dispose();
    bytes.dispose();
  };
}
