"use strict";
// The dashboard's drawing: small SVG charts (a line chart with fault marks, a
// membership timeline) and DOM helpers, with no library. svg.py draws the same
// shapes on the server for the report; keep the two alike.

const WIDTH = 720, HEIGHT = 220, LEFT = 60, RIGHT = 14, TOP = 14, BOTTOM = 30;
const ROW_PX = 20, NAME_PX = 120, LABEL_PX = 48;
const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  node.append(...children.map(c => (c instanceof Node ? c : String(c))));
  return node;
}

function sv(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  node.append(...children.map(c => (c instanceof Node ? c : String(c))));
  return node;
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / count, magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map(m => m * magnitude).find(s => s >= raw);
  const first = Math.ceil(lo / step - 1e-9) * step, out = [];
  for (let v = first; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

function tickLabel(v) {
  return v === 0 || (Math.abs(v) >= 0.01 && Math.abs(v) < 1e6) ? String(+v.toPrecision(4))
    : v.toExponential(1);
}

function frame(xmax, ylo, yhi, height, left) {
  xmax = xmax > 0 ? xmax : 1;
  if (!(yhi > ylo)) yhi = ylo + 1;
  return {xmax, ylo, yhi, left, height,
          x: v => left + (WIDTH - left - RIGHT) * v / xmax,
          y: v => TOP + (height - TOP - BOTTOM) * (1 - (v - ylo) / (yhi - ylo))};
}

function xAxis(f, bottom) {
  const out = [sv("line", {class: "axis", x1: f.left, y1: bottom, x2: WIDTH - RIGHT, y2: bottom})];
  for (const tick of niceTicks(0, f.xmax, 5)) {
    out.push(sv("text", {x: f.x(tick).toFixed(1), y: bottom + 14, "text-anchor": "middle"},
                tickLabel(tick)));
  }
  out.push(sv("text", {x: WIDTH - RIGHT, y: bottom + 26, "text-anchor": "end"}, "s"));
  return out;
}

function markLines(f, marks, bottom) {
  const out = [];
  let lastX = -1e9, level = 0;
  for (const m of [...marks].sort((a, b) => a.at - b.at)) {
    if (m.at < 0 || m.at > f.xmax) continue;
    const x = f.x(m.at), cls = m.kind.toLowerCase().replace(/[^a-z0-9_-]/g, "");
    level = x - lastX < LABEL_PX ? level + 1 : 0;  // close marks: labels step down
    lastX = x;
    out.push(sv("line", {class: `mark ${cls}`, x1: x.toFixed(1), y1: TOP, x2: x.toFixed(1), y2: bottom},
                sv("title", {}, `${m.kind}: ${m.who instanceof Node ? m.who.textContent : m.who} ${m.text}`)));
    out.push(sv("text", {class: "mark-label", x: (x + 3).toFixed(1), y: TOP + 9 + 10 * (level % 4)}, m.kind));
  }
  return out;
}

function draw(svg, height, children) {
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${height}`);
  svg.replaceChildren(...children);
}

function lineChart(svg, points, {xmax, marks, series, pathId, yLabel}) {
  const ys = points.map(p => p[1]).filter(y => y != null && isFinite(y));
  // (reduce, not Math.min(...ys): a long run has more points than a call has arguments)
  const lo = ys.length ? ys.reduce((a, b) => Math.min(a, b)) : 0;
  const hi = ys.length ? ys.reduce((a, b) => Math.max(a, b)) : 1;
  const pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
  const f = frame(xmax, lo - pad, hi + pad, HEIGHT, LEFT), bottom = HEIGHT - BOTTOM;
  const body = [];
  for (const tick of niceTicks(f.ylo, f.yhi, 4)) {
    const y = f.y(tick).toFixed(1);
    body.push(sv("line", {class: "grid", x1: LEFT, y1: y, x2: WIDTH - RIGHT, y2: y}),
              sv("text", {x: LEFT - 6, y: (+y + 4).toFixed(1), "text-anchor": "end"}, tickLabel(tick)));
  }
  body.push(...xAxis(f, bottom), sv("text", {x: LEFT, y: TOP - 3}, yLabel), ...markLines(f, marks, bottom));
  const path = [];
  let penDown = false;
  for (const [x, y] of points) {
    if (y == null || !isFinite(y)) { penDown = false; continue; }
    path.push(`${penDown ? "L" : "M"}${f.x(x).toFixed(1)} ${f.y(y).toFixed(1)}`);
    penDown = true;
  }
  body.push(sv("path", {id: pathId, class: `series ${series}`, "data-points": ys.length, d: path.join(" ")}));
  draw(svg, HEIGHT, body);
}

function timeline(svg, rows, {xmax, marks, epochs}) {
  const height = TOP + BOTTOM + ROW_PX * Math.max(rows.length, 1), bottom = height - BOTTOM;
  const f = frame(xmax, 0, 1, height, NAME_PX);
  const body = xAxis(f, bottom);
  for (const [x, epoch] of epochs) {
    body.push(sv("line", {class: "epoch", x1: f.x(x).toFixed(1), y1: TOP, x2: f.x(x).toFixed(1), y2: bottom},
                 sv("title", {}, `epoch ${epoch}`)));
  }
  rows.forEach((row, i) => {
    const top = TOP + i * ROW_PX;
    body.push(sv("text", {x: NAME_PX - 6, y: top + 14, "text-anchor": "end", class: "member"},
                 row.name.slice(-20), sv("title", {}, row.name)));
    for (const [start, end] of row.spans) {
      const x0 = f.x(Math.max(start, 0)), x1 = f.x(Math.min(end, f.xmax));
      body.push(sv("rect", {class: row.lease ? "bar lease" : "bar", x: x0.toFixed(1), y: top + 3,
                            width: Math.max(x1 - x0, 1).toFixed(1), height: ROW_PX - 6},
                   sv("title", {}, `${row.name}: ${start.toFixed(1)}-${end.toFixed(1)} s`)));
    }
  });
  body.push(...markLines(f, marks, bottom));
  draw(svg, height, body);
}

function table(headers, rows, numeric = []) {
  if (!rows.length) return el("p", {class: "empty"}, "none yet");
  const head = el("tr", {}, ...headers.map((h, i) => el("th", numeric.includes(i) ? {class: "num"} : {}, h)));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows.map(row =>
    el("tr", {}, ...row.map((cell, i) => el("td", numeric.includes(i) ? {class: "num"} : {}, cell))))));
}

function hash(text) {
  return el("span", {class: "hash"}, text);
}

function kindBadge(kind) {
  return el("span", {class: `kind ${kind}`}, kind);
}
