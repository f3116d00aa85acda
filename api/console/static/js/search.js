// Search a topic's messages: by key, by a property (name=value), by text in the payload and by
// publish time. The search reads the partition through the range-read API from its first kept
// offset (or the first published at or after "from"), page by page, and keeps the messages that
// match every condition given, until it has as many as asked for, reaches the end, passes "to"
// or has read SEARCH_SCANNED_MAX messages; the summary says which offsets it read, so a search
// that stopped early can go on from there.

import { get } from "./api.js";
import { button, field, h, parseTime } from "./dom.js";

export const SEARCH_SCANNED_MAX = 20000;
const SEARCH_PAGE_MESSAGES = 500;
const SEARCH_PAGE_BYTES_MAX = 4 * 1024 * 1024;

function bytesText(base64) {
  const binary = atob(base64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
  return new TextDecoder("utf-8").decode(bytes);
}

/** The conditions of the form, checked: {key, property: [name, value], text, fromMs, toMs}. */
function conditions(form) {
  const property = form.property.value.trim();
  if (property && !property.includes("=")) {
    throw Object.assign(new Error(`Property: write name=value, not "${property}"`), { code: "invalid_property" });
  }
  const eq = property.indexOf("=");
  return {
    key: form.key.value, property: property ? [property.slice(0, eq), property.slice(eq + 1)] : null,
    text: form.text.value, fromMs: form.from.value.trim() ? parseTime(form.from.value) : null,
    toMs: form.to.value.trim() ? parseTime(form.to.value) : null,
  };
}

function matches(message, c) {
  if (c.key && message.key !== c.key) return false;
  if (c.property && (message.properties || {})[c.property[0]] !== c.property[1]) return false;
  if (c.fromMs !== null && message.publishTimeMs < c.fromMs) return false;
  if (c.text && !bytesText(message.payload).includes(c.text)) return false;
  return true;
}

/**
 * The search form; ``run(search)`` is called with an async function that does the search for a
 * partition and a count: {messages, scanned, first, next, complete} (``first``: the offset it
 * started at; ``next``: the one after the last it read).
 */
export function searchForm(ctx, readPath, run) {
  const form = {
    key: h("input", { name: "searchKey", placeholder: "exact key", autocomplete: "off" }),
    property: h("input", { name: "searchProperty", placeholder: "name=value", autocomplete: "off" }),
    text: h("input", { name: "searchText", placeholder: "text in the payload", autocomplete: "off" }),
    from: h("input", { name: "searchFrom", placeholder: "2026-01-31 12:00 (local)", autocomplete: "off" }),
    to: h("input", { name: "searchTo", placeholder: "or epoch ms", autocomplete: "off" }),
  };

  /** Where the search starts in ``partition``: the first kept offset, or the first published at or after ``fromMs``. */
  async function start(partition, fromMs) {
    const answer = await get(`${ctx.paths.rest}/offsets`, fromMs === null ? {} : { timestamp: fromMs });
    const names = Object.keys(answer.offsets);
    const name = ctx.partitions ? names.find((n) => n.endsWith(`-partition-${partition}`)) : names[0];
    const offsets = answer.offsets[name];
    return fromMs === null ? offsets.first : Math.max(offsets.first, offsets.atTimestamp);
  }

  async function search(partition, wanted) {
    const c = conditions(form);
    const found = [];
    let offset = await start(partition, c.fromMs);
    let scanned = 0;
    const first = offset;
    for (;;) {
      const page = await get(readPath(partition), { offset, maxMessages: SEARCH_PAGE_MESSAGES,
        maxBytes: SEARCH_PAGE_BYTES_MAX });
      const done = (complete) => ({ messages: found, scanned, first, next: offset, complete });
      if (!page.messages.length) return done(true);
      for (const message of page.messages) {
        if (c.toMs !== null && message.publishTimeMs > c.toMs) return done(true);
        scanned += 1;
        offset = message.offset + 1;
        if (matches(message, c)) found.push(message);
        if (found.length >= wanted || scanned >= SEARCH_SCANNED_MAX) return done(false);
      }
      offset = page.nextOffset;
    }
  }

  return h("form", {
    class: "form-row search",
    onsubmit: (event) => {
      event.preventDefault();
      run(search);
    },
  }, field("Key", form.key), field("Property", form.property), field("Text", form.text),
  field("Published from", form.from), field("to", form.to), button("Search", null, { type: "submit" }));
}
