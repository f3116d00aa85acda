// Peeking at a subscription's next messages without consuming them: Pulsar's admin peek
// (GET .../subscription/{sub}/position/{n}, one message per position, 1 the next to deliver),
// asked for positions 1..N in turn. Nothing moves: the backlog is what it was.

import { getMessage } from "./api.js";
import { errorBox, field, h, replace } from "./dom.js";
import { messageCard } from "./messages.js";

export const PEEK_MESSAGES_DEFAULT = 5;
export const PEEK_MESSAGES_MAX = 100;

/** A peeked message as the Messages tab's cards show one, from the admin API's headers. */
function peeked({ bytes, headers }) {
  const key = headers.get("X-Pulsar-partition-key");
  const keyB64 = headers.get("X-Pulsar-partition-key-b64-encoded") === "true";
  let properties = {};
  try {
    properties = JSON.parse(headers.get("X-Pulsar-PROPERTY") || "{}");
  } catch {
    properties = {};
  }
  const eventTime = headers.get("X-Pulsar-event-time");
  return {
    bytes,
    offset: Number(headers.get("X-Magnetar-Offset")),
    messageId: headers.get("X-Magnetar-Message-ID") || headers.get("X-Pulsar-Message-ID"),
    publishTime: Date.parse(headers.get("X-Pulsar-publish-time")),
    key: key === null ? undefined : keyB64 ? `${key} (base64)` : key,
    eventTime: eventTime ? Date.parse(eventTime) : undefined,
    properties,
  };
}

/**
 * The "Peek" form of the subscription actions; `subscription()` names the chosen subscription
 * (or reports that none is chosen and returns ""). The cards go to `element` below the form.
 */
export function peekPanel(ctx, subscription) {
  const count = h("input", { type: "number", name: "peekCount", min: 1, max: PEEK_MESSAGES_MAX, step: 1,
    value: String(PEEK_MESSAGES_DEFAULT) });
  const mode = h("select", { name: "peekView" }, h("option", { value: "text" }, "text"),
    h("option", { value: "json" }, "JSON (pretty)"), h("option", { value: "hex" }, "hex"));
  const list = h("div", { class: "messages" });
  const element = h("div", { class: "peeked" });
  let shown = null;

  function render() {
    if (!shown) return;
    replace(list, h("p", { class: "muted list-summary" }, shown.summary),
      shown.messages.map((m) => messageCard(m, mode.value, false)));
  }

  async function peek(event) {
    event.preventDefault();
    const name = subscription();
    if (!name) return;
    const wanted = Math.min(Math.max(Math.floor(Number(count.value)) || PEEK_MESSAGES_DEFAULT, 1), PEEK_MESSAGES_MAX);
    const base = `${ctx.paths.admin}/subscription/${encodeURIComponent(name)}/position`;
    const messages = [];
    replace(element, h("p", { class: "muted" }, "Peeking…"));
    try {
      for (let position = 1; position <= wanted; position += 1) {
        messages.push(peeked(await getMessage(`${base}/${position}`)));
      }
    } catch (error) {
      if (error.status !== 404 || !messages.length) {
        replace(element, errorBox(error));
        return;
      }
    }
    const summary = messages.length < wanted
      ? `Only ${messages.length} messages in the backlog of ${name} (asked for ${wanted}); none consumed.`
      : `The next ${messages.length} messages of ${name}, not consumed: its backlog is unchanged.`;
    shown = { summary, messages };
    replace(element, h("div", { class: "form-row" }, field("Show payload as", mode)), list);
    render();
  }

  mode.addEventListener("change", render);
  const form = h("form", { class: "form-row", onsubmit: peek },
    field("Peek next", count, `messages, at most ${PEEK_MESSAGES_MAX}`), h("button", { type: "submit" }, "Peek"));
  return { form, element };
}
