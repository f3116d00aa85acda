// A time-series line chart on a <canvas>: a few series over the last minutes, y axis from 0 to
// a rounded maximum, drawn again whenever data arrives or the canvas changes size.

import { h } from "./dom.js";

const HEIGHT_PX = 170;
const PAD = { left: 64, right: 12, top: 10, bottom: 22 };

/** The smallest of 1, 2, 2.5, 5 times a power of ten, in units of `unit` (1 or a power of 1024
 * for bytes, so byte axes read 256 KiB rather than 262.1 KiB), at or above `value`. */
function niceCeiling(value, unit) {
  const scaled = value / unit;
  const magnitude = 10 ** Math.floor(Math.log10(scaled));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (scaled <= step * magnitude) return step * magnitude * unit;
  }
  return 10 * magnitude * unit;
}

function unitOf(value, binary) {
  if (!binary) return 1;
  let unit = 1;
  while (value >= unit * 1024) unit *= 1024;
  return unit;
}

function swatch(color) {
  const el = h("span", { class: "swatch" });
  el.style.background = `var(${color})`; // through the CSSOM: the console's CSP forbids style attributes
  return el;
}

export class TimeChart {
  /**
   * series: [{key, label, color}] (color: a CSS custom property such as "--series-in");
   * format(value) labels the y axis; windowMs is the time span shown (newest point at the right);
   * floor is the least top of the y axis; binary rounds it in powers of 1024 (bytes).
   */
  constructor({ title, series, format, windowMs, floor = 1, binary = false }) {
    this.floor = floor;
    this.binary = binary;
    this.series = series;
    this.format = format;
    this.windowMs = windowMs;
    this.points = [];
    this.canvas = h("canvas", { class: "chart-canvas", height: HEIGHT_PX, role: "img", "aria-label": title });
    this.element = h("figure", { class: "chart" },
      h("figcaption", {}, h("span", { class: "chart-title" }, title),
        h("span", { class: "legend" }, series.map((s) => h("span", { class: "legend-item" },
          swatch(s.color), s.label)))),
      this.canvas);
    this.resizeObserver = new ResizeObserver(() => this.draw());
    this.resizeObserver.observe(this.element);
  }

  setPoints(points) {
    this.points = points;
    this.canvas.dataset.points = String(points.length);
    this.canvas.dataset.firstAt = points.length ? String(points[0].t) : "";
    this.draw();
  }

  dispose() {
    this.resizeObserver.disconnect();
  }

  draw() {
    const width = Math.max(this.element.clientWidth, 200);
    const ratio = window.devicePixelRatio || 1;
    const canvas = this.canvas;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${HEIGHT_PX}px`;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(HEIGHT_PX * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, HEIGHT_PX);
    const plotW = width - PAD.left - PAD.right;
    const plotH = HEIGHT_PX - PAD.top - PAD.bottom;
    const now = this.points.length ? this.points[this.points.length - 1].t : Date.now();
    const start = now - this.windowMs;
    const top = Math.max(this.floor, ...this.points.flatMap((p) => this.series.map((s) => p[s.key] || 0)));
    const max = niceCeiling(top, unitOf(top, this.binary));
    const style = getComputedStyle(document.documentElement);
    const grid = style.getPropertyValue("--chart-grid").trim() || "#ddd";
    const ink = style.getPropertyValue("--muted").trim() || "#666";
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = ink;
    ctx.strokeStyle = grid;
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i += 1) {
      const y = PAD.top + plotH - (plotH * i) / 4;
      ctx.beginPath();
      ctx.moveTo(PAD.left, Math.round(y) + 0.5);
      ctx.lineTo(PAD.left + plotW, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(this.format((max * i) / 4), PAD.left - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const minutes = Math.round(this.windowMs / 60000);
    for (let m = 0; m <= minutes; m += 1) {
      const x = PAD.left + plotW - (plotW * m * 60000) / this.windowMs;
      ctx.fillText(m === 0 ? "now" : `-${m} min`, Math.min(Math.max(x, PAD.left + 14), PAD.left + plotW - 10),
        PAD.top + plotH + 6);
    }
    if (!this.points.length) return;
    const xOf = (t) => PAD.left + ((t - start) / this.windowMs) * plotW;
    const yOf = (v) => PAD.top + plotH - (Math.max(v, 0) / max) * plotH;
    ctx.lineWidth = 2;
    ctx.lineJoin = "round";
    for (const s of this.series) {
      ctx.strokeStyle = style.getPropertyValue(s.color).trim() || "#2563eb";
      ctx.beginPath();
      let started = false;
      for (const point of this.points) {
        if (point.t < start) continue;
        const x = xOf(point.t);
        const y = yOf(point[s.key] || 0);
        if (started) ctx.lineTo(x, y);
        else ctx.moveTo(x, y);
        started = true;
      }
      ctx.stroke();
    }
  }
}
