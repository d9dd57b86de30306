// The learning curves' first drawing: the binned curves (each series' mean, and its 10–90 % band) drawn on a
// <canvas> as soon as /curves/binned answers, while Plotly.js (1.2 MB to compile and run, which blocks the page
// for about half a second on a small machine) is not loaded yet. Plotly then draws the interactive plot in its
// place (renderPlots removes the sketch). Loaded after common.js, before the page's own script.
"use strict";

const SKETCH_MARGIN = { t: 30, r: 20, b: 50, l: 60 };  // as the Plotly layout's, so nothing jumps when it takes over
const SKETCH_TICKS = 5;
const SKETCH_MAX_TICKS = 50;  // a bound on any axis's ticks, whatever its ends
const SKETCH_MARKERS = 30;  // series of fewer bins get a marker on each (as binnedTraces' "lines+markers")

// Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart), at most SKETCH_MAX_TICKS of them,
// for any finite ends: the step is never finer than the float grid at the ends' magnitude (so every tick differs
// from the last; an axis a few float steps wide at 1e17 gets one tick), and the loop counts its ticks.
function sketchTicks(lo, hi, count = SKETCH_TICKS) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (!(hi > lo)) return [lo];
  const grain = Math.max(Math.abs(lo), Math.abs(hi)) * Number.EPSILON * 2;  // what adding a step always moves
  const share = Number.isFinite(hi - lo) ? (hi - lo) / count : hi / count - lo / count;  // ±1.7e308: no overflow
  const raw = Math.max(share, grain, Number.MIN_VALUE);  // never zero (denormals)
  const power = 10 ** Math.floor(Math.log10(raw));
  const nice = power > 0 && Number.isFinite(power) ? [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) : 0;
  const step = nice || raw;
  const first = Math.ceil(lo / step) * step, out = [];
  for (let i = 0; i < SKETCH_MAX_TICKS; i++) {
    const v = first + i * step;
    if (!(v <= hi + step * 1e-9)) break;
    const tick = Math.abs(v) < step * 1e-9 ? 0 : v;
    if (tick !== out[out.length - 1]) out.push(tick);
  }
  return out.length ? out : [lo];
}

// [lo, hi] widened by at least ``half`` on each side, by more where the float grid at their magnitude is coarser
// (at 1e17, adding 0.5 changes nothing).
function sketchWiden(lo, hi, half) {
  const d = Math.max(half, Math.max(Math.abs(lo), Math.abs(hi)) * Number.EPSILON * 4);
  return [lo - d, hi + d];
}

function sketchLabel(v, time) {
  if (time) return new Date(v * 1000).toISOString().slice(11, 16);  // wall_time: seconds since the epoch, UTC
  const a = Math.abs(v);
  if (a >= 1e9) return `${+(v / 1e9).toPrecision(3)}G`;
  if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
  if (a >= 1e3) return `${+(v / 1e3).toPrecision(3)}k`;
  return `${+v.toPrecision(3)}`;
}

// Draw ``series`` (the /curves/binned series shown: bins' lo/hi edges, mean, p10, p90) into ``div`` on a canvas
// filling it: ``colorOf(series)`` gives each its colour, ``band`` draws the 10–90 % bands, ``time`` labels x as
// clock times. Returns what was drawn ({series, points}); ``div`` keeps the canvas until unsketch(div).
function sketchCurves(div, series, { colorOf, band, time, xTitle, yTitle }) {
  unsketch(div);
  const canvas = document.createElement("canvas");
  canvas.className = "sketch";
  const width = div.clientWidth || 800, height = div.clientHeight || 440, ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio; canvas.height = height * ratio;
  canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
  div.appendChild(canvas);
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  const mid = (b, i) => (b.lo[i] + b.hi[i]) / 2;
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, points = 0;
  for (const b of series) {
    for (let i = 0; i < b.bin.length; i++) {
      x0 = Math.min(x0, mid(b, i)); x1 = Math.max(x1, mid(b, i));
      for (const y of band ? [b.p10[i], b.p90[i], b.mean[i]] : [b.mean[i]]) {
        if (y !== null && Number.isFinite(y)) { y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
      }
    }
  }
  const plotW = width - SKETCH_MARGIN.l - SKETCH_MARGIN.r, plotH = height - SKETCH_MARGIN.t - SKETCH_MARGIN.b;
  if (!(x1 >= x0) || !(y1 >= y0)) return { series: 0, points: 0 };
  if (x1 === x0) [x0, x1] = sketchWiden(x0, x1, 0.5);
  if (y1 === y0) [y0, y1] = sketchWiden(y0, y1, 0.5);
  [y0, y1] = sketchWiden(y0, y1, (y1 - y0) * 0.05);
  const px = (x) => SKETCH_MARGIN.l + ((x - x0) / (x1 - x0)) * plotW;
  const py = (y) => SKETCH_MARGIN.t + (1 - (y - y0) / (y1 - y0)) * plotH;
  ctx.font = "12px sans-serif"; ctx.fillStyle = "#444"; ctx.strokeStyle = "#eee"; ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (const v of sketchTicks(y0, y1)) {
    ctx.beginPath(); ctx.moveTo(SKETCH_MARGIN.l, py(v)); ctx.lineTo(SKETCH_MARGIN.l + plotW, py(v)); ctx.stroke();
    ctx.fillText(sketchLabel(v, false), SKETCH_MARGIN.l - 6, py(v));
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (const v of sketchTicks(x0, x1)) ctx.fillText(sketchLabel(v, time), px(v), SKETCH_MARGIN.t + plotH + 6);
  ctx.fillText(xTitle, SKETCH_MARGIN.l + plotW / 2, height - 18);
  ctx.save(); ctx.translate(14, SKETCH_MARGIN.t + plotH / 2); ctx.rotate(-Math.PI / 2); ctx.fillText(yTitle, 0, 0);
  ctx.restore();
  for (const b of series) {  // the bands first, then every mean over them
    if (!band) break;
    ctx.fillStyle = rgba(colorOf(b), 0.18);
    ctx.beginPath();
    const kept = b.bin.map((_, i) => i).filter((i) => b.p10[i] !== null && b.p90[i] !== null);
    kept.forEach((i, k) => (k ? ctx.lineTo : ctx.moveTo).call(ctx, px(mid(b, i)), py(b.p90[i])));
    for (const i of kept.reverse()) ctx.lineTo(px(mid(b, i)), py(b.p10[i]));
    ctx.fill();
  }
  ctx.lineWidth = 2.5; ctx.lineJoin = "round";
  for (const b of series) {
    ctx.strokeStyle = colorOf(b);
    ctx.beginPath();
    let down = false;
    for (let i = 0; i < b.bin.length; i++) {
      const y = b.mean[i];
      if (y === null || !Number.isFinite(y)) { down = false; continue; }
      (down ? ctx.lineTo : ctx.moveTo).call(ctx, px(mid(b, i)), py(y));
      down = true; points += 1;
    }
    ctx.stroke();
    if (b.bin.length < SKETCH_MARKERS) {  // few bins: a marker on each, as Plotly's "lines+markers"
      ctx.fillStyle = colorOf(b);
      for (let i = 0; i < b.bin.length; i++) {
        if (b.mean[i] === null || !Number.isFinite(b.mean[i])) continue;
        ctx.beginPath(); ctx.arc(px(mid(b, i)), py(b.mean[i]), 4, 0, 2 * Math.PI); ctx.fill();
      }
    }
  }
  return { series: series.length, points };
}

function unsketch(div) {
  for (const c of div.querySelectorAll("canvas.sketch")) c.remove();
}
