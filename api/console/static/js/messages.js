// A topic's messages: browse them through the range-read API (from an offset, or from a message
// id resolved to its partition and offset) or one key's event stream by version (the stream
// read API: only that key's messages, in version order), search them (search.js), show payloads
// as text, pretty JSON or hex (binary as hex in the text view), and produce a test message
// through REST produce.
//
// Each way of finding where to start browsing is one entry of START_FINDERS: a form that ends
// in go(start), where start is {partition, offset, highlight} (a range read) or {key,
// fromVersion, highlight, newest} (a stream read; fromVersion null: the first version kept;
// newest: the last page of the stream). The list a read returns is shown the same way whatever
// found its start; paging and the oldest/newest buttons move in offsets or in versions, as the
// list shown is one or the other.

import { get, request } from "./api.js";
import { button, errorBox, field, fmtTime, h, messageIdText, notice, panel, replace } from "./dom.js";
import { searchForm } from "./search.js";

export const MESSAGES_SHOWN_DEFAULT = 20;
export const MESSAGES_SHOWN_MAX = 200;
export const READ_BYTES_MAX = 4 * 1024 * 1024;
export const PAYLOAD_SHOWN_BYTES_MAX = 64 * 1024;
const HEX_BYTES_PER_LINE = 16;
const PRODUCER_NAME = "magnetar-console";

function bytesOf(base64) {
  const binary = atob(base64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function hexDump(bytes) {
  const lines = [];
  for (let at = 0; at < bytes.length; at += HEX_BYTES_PER_LINE) {
    const row = bytes.subarray(at, at + HEX_BYTES_PER_LINE);
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex.padEnd(HEX_BYTES_PER_LINE * 3 - 1)}  ${ascii}`);
  }
  return lines.join("\n") || "(empty)";
}

const CONTROL_CHARACTERS = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/;

/** Whether ``bytes`` read as text: valid UTF-8 (a cut multi-byte character at the end aside)
 * without control characters other than tab and line ends. */
function isText(bytes) {
  try {
    return !CONTROL_CHARACTERS.test(new TextDecoder("utf-8", { fatal: true }).decode(bytes, { stream: true }));
  } catch {
    return false;
  }
}

/** The payload as the chosen view shows it: a <pre>, and a note when it is not what was asked. */
export function payloadView(base64, mode) {
  return bytesView(bytesOf(base64), mode);
}

export function bytesView(bytes, mode) {
  const shown = bytes.subarray(0, PAYLOAD_SHOWN_BYTES_MAX);
  const cut = bytes.length > shown.length
    ? h("p", { class: "muted" }, `First ${shown.length} of ${bytes.length} bytes shown.`) : null;
  if (mode === "hex") return [h("pre", { class: "payload hex" }, hexDump(shown)), cut];
  if (mode === "text" && !isText(shown)) {
    return [h("p", { class: "muted binary-note" }, "Binary (not UTF-8 text): shown as hex."),
      h("pre", { class: "payload hex" }, hexDump(shown)), cut];
  }
  const text = new TextDecoder("utf-8").decode(shown);
  if (mode === "json") {
    try {
      return [h("pre", { class: "payload json" }, JSON.stringify(JSON.parse(text), null, 2)), cut];
    } catch (error) {
      return [h("p", { class: "muted" }, `Not JSON (${error.message}); shown as text.`),
        h("pre", { class: "payload" }, text), cut];
    }
  }
  return [h("pre", { class: "payload" }, text || h("span", { class: "muted" }, "(empty)")), cut];
}

/**
 * A message as a card: offset, id, publish time, key, event time, properties and payload
 * (``payload`` base64, or ``bytes``).
 */
export function messageCard(message, mode, highlight) {
  const properties = Object.entries(message.properties || {});
  const versioned = message.keyVersion !== undefined;
  const dataset = versioned ? { offset: message.offset, version: message.keyVersion } : { offset: message.offset };
  return h("article", { class: `message${highlight ? " highlight" : ""}`, dataset },
    h("dl", { class: "message-head" },
      versioned ? h("div", {}, h("dt", {}, "version"), h("dd", { class: "key-version" }, String(message.keyVersion)))
        : null,
      h("div", {}, h("dt", {}, "offset"), h("dd", {}, String(message.offset))),
      h("div", {}, h("dt", {}, "message id"), h("dd", { class: "mono message-id" },
        messageIdText(message.messageId) || message.messageId)),
      h("div", {}, h("dt", {}, "published"), h("dd", {}, fmtTime(message.publishTime))),
      message.key !== undefined ? h("div", {}, h("dt", {}, "key"), h("dd", { class: "mono key" }, message.key)) : null,
      message.eventTime !== undefined ? h("div", {}, h("dt", {}, "event time"), h("dd", {}, fmtTime(message.eventTime)))
        : null,
      properties.length ? h("div", {}, h("dt", {}, "properties"), h("dd", { class: "mono properties" },
        properties.map(([k, v]) => `${k}=${v}`).join(", "))) : null),
    message.bytes ? bytesView(message.bytes, mode) : payloadView(message.payload, mode));
}

function offsetFinder(ctx, go, partitionSelect) {
  const offset = h("input", { type: "number", name: "offset", min: 0, step: 1, value: "0" });
  const submit = (event) => {
    event.preventDefault();
    go({ partition: Number(partitionSelect.value || 0), offset: offset.value });
  };
  return {
    form: h("form", { class: "form-row", onsubmit: submit },
      ctx.partitions ? field("Partition", partitionSelect) : null,
      field("From offset", offset), h("button", { type: "submit" }, "Read")),
    offset,
  };
}

function messageIdFinder(ctx, go, slot) {
  const messageId = h("input", { name: "messageId", placeholder: "ledger:entry[:partition[:batch]] or base64",
    autocomplete: "off" });
  const submit = async (event) => {
    event.preventDefault();
    try {
      const found = await get(`${ctx.paths.rest}/offsetOf`, { messageId: messageId.value.trim() });
      go({ partition: Math.max(found.partition, 0), offset: found.offset, highlight: found.offset });
    } catch (error) {
      replace(slot, errorBox(error));
    }
  };
  return {
    form: h("form", { class: "form-row", onsubmit: submit }, field("From message id", messageId),
      h("button", { type: "submit" }, "Find")),
  };
}

function keyStreamFinder(ctx, go) {
  const key = h("input", { name: "streamKey", placeholder: "an aggregate's key", autocomplete: "off", required: true });
  const fromVersion = h("input", { type: "number", name: "fromVersion", min: 0, step: 1, placeholder: "first kept" });
  const submit = (event) => {
    event.preventDefault();
    go({ key: key.value, fromVersion: fromVersion.value === "" ? null : Number(fromVersion.value) });
  };
  return {
    form: h("form", { class: "form-row", onsubmit: submit },
      field("Key stream", key, ctx.partitions ? "in the partition the key routes to" : null),
      field("From version", fromVersion), h("button", { type: "submit" }, "Read stream")),
    key,
    fromVersion,
  };
}

const START_FINDERS = [offsetFinder, messageIdFinder, keyStreamFinder];

/** The produce form's properties: undefined when empty, else the JSON object written. */
function propertiesOf(text) {
  if (text.trim() === "") return undefined;
  const refuse = (why) => Object.assign(new Error(`Properties: ${why}`), { code: "invalid_properties" });
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw refuse(`not a JSON object (${error.message})`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    const kind = Array.isArray(value) ? "an array" : value === null ? "null" : `a ${typeof value}`;
    throw refuse(`a JSON object of names and values, not ${kind}`);
  }
  return value;
}

function producePanel(ctx, browseTo) {
  const key = h("input", { name: "key", placeholder: "optional", autocomplete: "off" });
  const properties = h("textarea", { name: "properties", rows: 2, placeholder: '{"source": "console"}' });
  const payload = h("textarea", { name: "payload", rows: 4, placeholder: "message text or JSON" });
  const slot = h("div", { class: "action-slot" });

  async function send(event) {
    event.preventDefault();
    // The properties field must read as a JSON object (a mistake is named by the field, not by a
    // column of a request the user never saw); its values go as written, for the broker to judge.
    let given;
    try {
      given = propertiesOf(properties.value);
    } catch (error) {
      replace(slot, errorBox(error));
      return;
    }
    const message = { payload: payload.value };
    if (key.value !== "") message.key = key.value;
    if (given !== undefined) message.properties = given;
    const text = JSON.stringify({ producerName: PRODUCER_NAME, messages: [message] });
    const sent = h("details", {}, h("summary", {}, "Request sent"), h("pre", { class: "payload" }, text));
    replace(slot, h("p", { class: "muted" }, "Sending…"));
    try {
      const answer = await request("POST", ctx.paths.rest, { text });
      const result = answer.messagePublishResults[0];
      if (result.errorCode) {
        replace(slot, errorBox({ code: `error_${result.errorCode}`, message: result.errorMsg }), sent);
        return;
      }
      const partition = Math.max(Number(String(result.messageId).split(":")[2]), 0);
      const versioned = result.keyVersion !== undefined && result.keyVersion !== null;
      const stored = `Stored: message id ${result.messageId}, offset ${result.offset}` +
        (versioned ? `, version ${result.keyVersion} of key ${key.value}.` : ".");
      const streamKey = key.value;
      replace(slot, notice(stored),
        button("Show it", () => browseTo({ partition, offset: result.offset, highlight: result.offset }),
          { class: "small" }),
        versioned ? button("Show its stream", () => browseTo({ key: streamKey, fromVersion: null,
          highlight: result.keyVersion, newest: true }), { class: "small" }) : null,
        sent);
    } catch (error) {
      replace(slot, errorBox(error), sent);
    }
  }

  return panel("Produce a test message",
    h("form", { class: "produce-form", onsubmit: send },
      h("div", { class: "form-row" }, field("Key", key), field("Properties (JSON object)", properties)),
      field("Payload", payload),
      h("div", { class: "form-row" }, h("button", { type: "submit" }, "Send"),
        ctx.partitions ? h("span", { class: "muted" }, "Routed to a partition by its key (round-robin without one).")
          : null)),
    slot);
}

export function messagesTab(root, ctx) {
  const list = h("div", { class: "messages" });
  const slot = h("div", { class: "action-slot" });
  const count = h("input", { type: "number", name: "count", min: 1, max: MESSAGES_SHOWN_MAX, step: 1,
    value: String(MESSAGES_SHOWN_DEFAULT) });
  const mode = h("select", { name: "view" }, h("option", { value: "text" }, "text"),
    h("option", { value: "json" }, "JSON (pretty)"), h("option", { value: "hex" }, "hex"));
  const partitionSelect = h("select", { name: "partition" },
    Array.from({ length: ctx.partitions }, (_, i) => h("option", { value: String(i) }, String(i))));
  // A range read: {messages, highlight, partition, offset, nextOffset, firstOffset}; a stream
  // read: {stream: key, messages, highlight, partition, fromVersion, nextVersion, firstVersion, version}.
  let shown = null;

  const readPath = (partition) => (ctx.partitions ? `${ctx.paths.rest}/partitions/${partition}/messages`
    : `${ctx.paths.rest}/messages`);
  const streamPath = (key) => `${ctx.paths.rest}/keys/${encodeURIComponent(key)}`;
  const size = () => Math.min(Math.max(Number(count.value) || MESSAGES_SHOWN_DEFAULT, 1), MESSAGES_SHOWN_MAX);

  function summary() {
    const where = ctx.partitions ? `partition ${shown.partition}, ` : "";
    if (shown.search) {
      const read = shown.scanned ? `offsets ${shown.first} – ${shown.next - 1}` : "nothing";
      return `Search: ${shown.messages.length} matching in ${where}${read} (${shown.scanned} read` +
        `${shown.complete ? ", to the end" : `; search on from offset ${shown.next}`}).`;
    }
    const first = shown.messages[0];
    const last = shown.messages[shown.messages.length - 1];
    if (shown.stream === undefined) {
      return shown.messages.length ? `${where}offsets ${first.offset} – ${last.offset} (first kept: ${shown.firstOffset})`
        : `${where}no messages from offset ${shown.offset} on (first kept: ${shown.firstOffset}).`;
    }
    const stream = `Stream of key ${shown.stream}: ${where}`;
    if (shown.version < 0) return `${stream}no messages yet (version -1).`;
    return shown.messages.length
      ? `${stream}versions ${first.keyVersion} – ${last.keyVersion} of 0 – ${shown.version} ` +
        `(first kept: ${shown.firstVersion})`
      : `${stream}no versions from ${shown.fromVersion} on (last: ${shown.version}).`;
  }

  function render() {
    if (!shown) return;
    const marked = (m) => (shown.stream === undefined ? m.offset : m.keyVersion) === shown.highlight;
    replace(list, h("p", { class: "muted list-summary" }, summary()),
      shown.messages.map((m) => messageCard(m, mode.value, marked(m))));
  }

  async function goOffsets({ partition, offset, highlight }) {
    if (ctx.partitions) partitionSelect.value = String(partition);
    finders[0].offset.value = String(offset);
    const answer = await get(readPath(partition), { offset, maxMessages: size(), maxBytes: READ_BYTES_MAX });
    shown = { messages: answer.messages, highlight, partition, offset: Number(offset),
      nextOffset: answer.nextOffset, firstOffset: answer.firstOffset };
  }

  /** A stream read from fromVersion (null: the first kept; with newest, the last page instead). */
  async function goStream({ key, fromVersion, highlight, newest }) {
    let from = fromVersion;
    if (newest) {
      const info = await get(streamPath(key));
      from = Math.max(info.firstVersion, info.version - size() + 1, 0);
    }
    streamFinder.key.value = key;
    streamFinder.fromVersion.value = from === null ? "" : String(from);
    const query = { maxMessages: size(), maxBytes: READ_BYTES_MAX };
    if (from !== null) query.fromVersion = from;
    const answer = await get(`${streamPath(key)}/messages`, query);
    shown = { stream: key, messages: answer.messages, highlight, partition: answer.partition,
      fromVersion: from === null ? answer.firstVersion : from, nextVersion: answer.nextVersion,
      firstVersion: answer.firstVersion, version: answer.version };
  }

  async function go(start) {
    replace(slot);
    try {
      await ("key" in start ? goStream(start) : goOffsets(start));
      render();
    } catch (error) {
      replace(slot, errorBox(error));
    }
  }

  async function ends() {
    const answer = await get(`${ctx.paths.rest}/offsets`);
    const partition = Number(partitionSelect.value || 0);
    const names = Object.keys(answer.offsets);
    const name = ctx.partitions ? names.find((n) => n.endsWith(`-partition-${partition}`)) : names[0];
    return { partition, ...answer.offsets[name] };
  }

  const jump = (where) => async () => {
    if (shown && shown.stream !== undefined) {
      go({ key: shown.stream, fromVersion: null, newest: where === "last" });
      return;
    }
    try {
      const end = await ends();
      const offset = where === "first" ? end.first : Math.max(end.first, end.next - size());
      go({ partition: end.partition, offset });
    } catch (error) {
      replace(slot, errorBox(error));
    }
  };

  const page = (direction) => () => {
    if (!shown) return;
    if (shown.search) {  // browse on from where the search stopped, or back from where it began
      go({ partition: shown.partition, offset: direction > 0 ? shown.next : Math.max(shown.first - size(), 0) });
      return;
    }
    if (shown.stream !== undefined) {
      const fromVersion = direction > 0 ? shown.nextVersion : Math.max(shown.firstVersion, shown.fromVersion - size());
      go({ key: shown.stream, fromVersion: Math.max(fromVersion, 0) });
      return;
    }
    const offset = direction > 0 ? shown.nextOffset : Math.max(shown.firstOffset, shown.offset - size());
    go({ partition: shown.partition, offset });
  };

  async function runSearch(search) {
    replace(slot);
    replace(list, h("p", { class: "muted list-summary" }, "Searching…"));
    try {
      const partition = Number(partitionSelect.value || 0);
      shown = { search: true, partition, ...(await search(partition, size())) };
      render();
    } catch (error) {
      replace(slot, errorBox(error));
    }
  }

  const finders = START_FINDERS.map((finder) => finder(ctx, go, finder === offsetFinder ? partitionSelect : slot));
  const streamFinder = finders[START_FINDERS.indexOf(keyStreamFinder)];
  mode.addEventListener("change", render);
  replace(root,
    panel("Browse",
      finders.map((f) => f.form),
      h("div", { class: "form-row" }, field("Messages", count), field("Show payload as", mode),
        button("Oldest", jump("first")), button("Newest", jump("last")),
        button("◀ Earlier", page(-1)), button("Later ▶", page(1))),
      h("details", { class: "search-panel" }, h("summary", {}, "Search messages"),
        searchForm(ctx, readPath, runSearch)),
      slot, list),
    producePanel(ctx, go));
  jump("last")();
  return () => {};
}
