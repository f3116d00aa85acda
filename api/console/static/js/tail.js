// Live tail: a WebSocket reader (Pulsar's /ws/v2/reader) on the topic, newest rows on top, at
// most TAIL_ROWS_MAX of them. Pausing stops acknowledging, so the broker stops sending once
// TAIL_RECEIVER_QUEUE messages wait (its flow control, not the page's memory, bounds a pause);
// resuming shows and acknowledges what waited.

import { get, webSocketUrl } from "./api.js";
import { button, errorBox, field, fmtTime, h, messageIdText, panel, replace } from "./dom.js";

export const TAIL_ROWS_MAX = 200;
export const TAIL_RECEIVER_QUEUE = 100;
const PREVIEW_CHARS_MAX = 200;

function preview(base64) {
  const binary = atob(base64);
  const bytes = new Uint8Array(Math.min(binary.length, PREVIEW_CHARS_MAX * 4));
  for (let i = 0; i < bytes.length; i += 1) bytes[i] = binary.charCodeAt(i);
  const text = new TextDecoder("utf-8").decode(bytes);
  return text.length > PREVIEW_CHARS_MAX || binary.length > bytes.length ? `${text.slice(0, PREVIEW_CHARS_MAX)}…` : text;
}

export function tailTab(root, ctx) {
  const rows = h("tbody", {});
  const status = h("span", { class: "tail-status", dataset: { state: "stopped" } }, "Stopped.");
  const counter = h("span", { class: "muted tail-counter" });
  const slot = h("div", { class: "action-slot" });
  const start = h("select", { name: "tailStart" }, h("option", { value: "latest" }, "new messages"),
    h("option", { value: "earliest" }, "the oldest message"));
  const startButton = button("Start", () => (socket ? stop() : open()));
  const pauseButton = button("Pause", () => (paused ? resume() : pause()), { disabled: true });
  let socket = null;
  let paused = false;
  let waiting = [];
  let received = 0;

  function setStatus(state, text) {
    status.dataset.state = state;
    replace(status, text);
  }

  function count() {
    replace(counter, `${received} received · ${rows.children.length} shown (at most ${TAIL_ROWS_MAX})` +
      (waiting.length ? ` · ${waiting.length} waiting` : ""));
  }

  function show(message) {
    rows.prepend(h("tr", { dataset: { offset: message.offset } },
      h("td", { "data-label": "Published" }, fmtTime(message.publishTime)),
      h("td", { class: "num", "data-label": "Offset" }, String(message.offset)),
      h("td", { class: "mono", "data-label": "Message id" }, messageIdText(message.messageId) || message.messageId),
      h("td", { class: "mono", "data-label": "Key" }, message.key ?? ""),
      h("td", { class: "mono tail-payload", "data-label": "Payload" }, preview(message.payload))));
    while (rows.children.length > TAIL_ROWS_MAX) rows.lastElementChild.remove();
    socket?.send(JSON.stringify({ messageId: message.messageId }));
  }

  async function open() {
    replace(slot);
    // Browsers hide why a WebSocket handshake was refused, so ask the same question over HTTP
    // first (the range-read offsets need the same consume permission) to show the API's answer.
    try {
      await get(`${ctx.paths.rest}/offsets`);
    } catch (error) {
      replace(slot, errorBox(error));
      return;
    }
    const ws = new WebSocket(webSocketUrl(ctx.paths.reader,
      { messageId: start.value, receiverQueueSize: String(TAIL_RECEIVER_QUEUE) }));
    socket = ws;
    paused = false;
    setStatus("connecting", "Connecting…");
    replace(startButton, "Stop");
    ws.onopen = () => {
      setStatus("live", "Live.");
      pauseButton.disabled = false;
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      if (typeof frame.messageId !== "string" || typeof frame.payload !== "string") return;
      received += 1;
      if (paused) waiting.push(frame);
      else show(frame);
      count();
    };
    ws.onclose = (event) => {
      if (socket !== ws) return;
      socket = null;
      pauseButton.disabled = true;
      replace(pauseButton, "Pause");
      replace(startButton, "Start");
      setStatus("closed", `Closed${event.code ? ` (${event.code}${event.reason ? `: ${event.reason}` : ""})` : ""}.`);
    };
  }

  function stop() {
    const ws = socket;
    socket = null;
    waiting = [];
    ws?.close();
    pauseButton.disabled = true;
    replace(pauseButton, "Pause");
    replace(startButton, "Start");
    setStatus("stopped", "Stopped.");
    count();
  }

  function pause() {
    paused = true;
    replace(pauseButton, "Resume");
    setStatus("paused", "Paused: the broker holds further messages.");
  }

  function resume() {
    paused = false;
    replace(pauseButton, "Pause");
    setStatus("live", "Live.");
    const held = waiting;
    waiting = [];
    held.forEach(show);
    count();
  }

  function clear() {
    rows.replaceChildren();
    received = 0;
    count();
  }

  count();
  replace(root, panel("Live tail",
    h("div", { class: "form-row" }, field("Start from", start), startButton, pauseButton, button("Clear", clear),
      status, counter),
    slot,
    h("div", { class: "table-wrap" }, h("table", { class: "tail" },
      h("thead", {}, h("tr", {}, ["Published", "Offset", "Message id", "Key", "Payload"].map((c) => h("th", {}, c)))),
      rows))));
  return () => {
    const ws = socket;
    socket = null;
    ws?.close();
  };
}
