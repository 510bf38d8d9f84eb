// Hand-written SVG charts: time lines and scatters, drawn from the few points the server sends.
// Only DOM calls, never markup strings, so no name or number can become markup.

import { shortTime } from "./format.js";

const NS = "http://www.w3.org/2000/svg";
const MARGIN = { left: 62, right: 14, top: 22, bottom: 26 };

function node(parent, name, attrs = {}, text) {
  const element = document.createElementNS(NS, name);
  for (const [key, value] of Object.entries(attrs)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  parent.appendChild(element);
  return element;
}

function size(svg) {
  const box = svg.viewBox.baseVal;
  return { width: box.width, height: box.height };
}

/** About `count` round numbers covering [lo, hi]; just [lo] when there is nothing above it
 * (an empty chart has no scale to show, rather than one of 1e-15). */
export function niceTicks(lo, hi, count = 4) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const ticks = [];
  // The last tick is at or above `hi`, so the highest value stays inside the frame.
  const last = Math.ceil(hi / step - 1e-9) * step;
  for (let v = Math.floor(lo / step) * step; v <= last + step * 1e-9; v += step) {
    ticks.push(Math.round(v / step) * step);
  }
  return ticks;
}

function timeTicks(lo, hi) {
  const steps = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400,
    172800, 604800];
  const step = steps.find((s) => (hi - lo) / s <= 6) || steps[steps.length - 1];
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) ticks.push(v);
  return ticks;
}

function frame(svg, { x, y, xTicks, xLabel, yTicks, yLabel }) {
  const { width, height } = size(svg);
  const axes = node(svg, "g", { class: "axes" });
  for (const tick of yTicks) {
    const py = y(tick);
    node(axes, "line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: py, y2: py, class: "grid" });
    node(axes, "text", { x: MARGIN.left - 6, y: py + 4, "text-anchor": "end" }, yLabel(tick));
  }
  for (const tick of xTicks) {
    const px = x(tick);
    // Labels at the edges lean inwards, so that none is cut off by the frame.
    const anchor = px > width - MARGIN.right - 24 ? "end" : px < MARGIN.left + 24 ? "start" : "middle";
    node(axes, "text", { x: px, y: height - 8, "text-anchor": anchor }, xLabel(tick));
  }
  node(axes, "line", {
    x1: MARGIN.left, x2: width - MARGIN.right,
    y1: height - MARGIN.bottom, y2: height - MARGIN.bottom, class: "axis",
  });
}

function legend(svg, series) {
  const group = node(svg, "g", { class: "legend" });
  let px = MARGIN.left;
  for (const s of series) {
    node(group, "rect", { x: px, y: 6, width: 10, height: 10, fill: s.color, rx: 2 });
    const label = node(group, "text", { x: px + 14, y: 15 }, s.name);
    px += 24 + label.getComputedTextLength();
  }
}

function emptyNote(svg, text) {
  const { width, height } = size(svg);
  node(svg, "text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, text);
}

/**
 * Lines over time. `series`: [{name, color, t: [epoch s], values: [number|null], dash}].
 * Gaps (null) break a line. `xDomain` [from, to] in epoch seconds.
 */
export function lineChart(svg, { series, xDomain, yFormat, yMin = 0, yMax, empty }) {
  svg.replaceChildren();
  const { width, height } = size(svg);
  const values = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  const [x0, x1] = xDomain;
  const top = Math.max(yMax ?? 0, ...values, yMin);
  const yTicks = niceTicks(yMin, top);
  const yHigh = yTicks.length > 1 ? yTicks[yTicks.length - 1] : yMin + 1;
  const x = (t) => MARGIN.left + ((t - x0) / Math.max(1e-9, x1 - x0)) * (width - MARGIN.left - MARGIN.right);
  const y = (v) => height - MARGIN.bottom - ((v - yMin) / Math.max(1e-9, yHigh - yMin)) * (height - MARGIN.top - MARGIN.bottom);
  const xTicks = timeTicks(x0, x1);
  frame(svg, { x, y, xTicks, xLabel: (t) => shortTime(t, x1 - x0, xTicks[1] - xTicks[0]), yTicks, yLabel: yFormat });
  legend(svg, series);
  let drawn = 0;
  for (const s of series) {
    let d = "";
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(s.t[i]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
      drawn += 1;
    });
    if (d) {
      const attrs = { d, fill: "none", stroke: s.color, "stroke-width": s.width || 2, class: "mark" };
      if (s.dash) attrs["stroke-dasharray"] = s.dash;
      node(svg, "path", attrs);
    }
    // A lone point between gaps would draw nothing as a line: mark every point when sparse.
    if (s.dots || s.values.filter((v) => v !== null && v !== undefined).length < 3) {
      s.values.forEach((v, i) => {
        if (v === null || v === undefined) return;
        node(svg, "circle", { cx: x(s.t[i]), cy: y(v), r: 2.5, fill: s.color, class: "mark" });
      });
    }
  }
  if (!drawn && empty) emptyNote(svg, empty);
  svg.dataset.marks = String(drawn);
}

/**
 * A scatter of charge against priority. `points`: {x: [0..1], y: [number], age: [seconds]}.
 */
export function scatterChart(svg, { x: xs, y: ys, age, yFormat, xLabel, color, maxAge, empty }) {
  svg.replaceChildren();
  const { width, height } = size(svg);
  const top = Math.max(0, ...ys);
  const yTicks = niceTicks(0, top);
  const yHigh = yTicks.length > 1 ? yTicks[yTicks.length - 1] : 1;
  const x = (v) => MARGIN.left + 6 + v * (width - MARGIN.left - MARGIN.right - 12);
  const y = (v) => height - MARGIN.bottom - (v / yHigh) * (height - MARGIN.top - MARGIN.bottom);
  frame(svg, {
    x, y, xTicks: [0, 0.25, 0.5, 0.75, 1], xLabel: (v) => v.toFixed(2), yTicks, yLabel: yFormat,
  });
  node(svg, "text", { x: MARGIN.left, y: 15, class: "axis-label" }, xLabel);
  const marks = node(svg, "g", { fill: color });
  // Oldest first, so the newest points are drawn on top.
  const order = xs.map((_, i) => i).sort((a, b) => age[b] - age[a]);
  for (const i of order) {
    const opacity = 0.2 + 0.75 * (1 - Math.min(1, age[i] / maxAge));
    node(marks, "circle", {
      cx: x(xs[i]).toFixed(1), cy: y(ys[i]).toFixed(1), r: 3, "fill-opacity": opacity.toFixed(2), class: "mark",
    });
  }
  if (!xs.length && empty) emptyNote(svg, empty);
  svg.dataset.marks = String(xs.length);
}
