// What both pages of the dashboard (page.html: runs and episodes; experiment.html: groups of runs compared) share:
// element lookup, series colours, loading Plotly.js, GET requests to the public REST API, and the status line.
// Loaded before each page's own script (classic scripts: these names are global to both).
"use strict";

const $ = (id) => document.getElementById(id);
const COLORS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00",
  "#b82e2e", "#316395"];
const PLOT_CONFIG = { responsive: true, displaylogo: false };

// "#rrggbb" as a CSS colour of that opacity.
function rgba(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

// Plotly.js (its basic bundle: scatter and bar traces) is served by the service, compressed. The pages preload
// it from their head and run it (plotlyReady) once their first requests are sent: compiling and running its
// 1.2 MB blocks the page for a moment, which then overlaps the service's answer instead of following it (the
// dashboard's page waits for its learning curves' sketch first: see sketch.js).
let plotly = null;

function plotlyReady() {
  plotly ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = document.body.dataset.plotly;
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => reject(new Error(`could not load ${script.src}`));
    document.head.appendChild(script);
  });
  return plotly;
}

function apiUrl(path, params = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(params)) {
    for (const item of [].concat(value)) {
      if (item !== undefined && item !== null && item !== "") url.searchParams.append(key, item);
    }
  }
  return url;
}

// How long the page keeps asking a route that answers 429 (every place of its kind taken: comparisons and learning
// curves across seeds run a few at a time, and a page asks for several at once), a little at a time.
const BUSY_RETRY_MS = 60000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The routes that compute per request: the service runs a few at a time (compute_max_concurrent, 2 by default),
// so the page sends at most that many at once and queues the rest.
const COMPUTED = new Set(["/compare", "/compare/scores", "/compare/improvement", "/compare/profile", "/curves/groups"]);
const COMPUTED_AT_ONCE = 2;
const computing = { running: 0, waiting: [] };

async function computePlace() {
  if (computing.running < COMPUTED_AT_ONCE) { computing.running += 1; return; }
  await new Promise((resolve) => computing.waiting.push(resolve));  // the place is handed over by the one leaving
}

function leavePlace() {
  const next = computing.waiting.shift();
  if (next) next(); else computing.running -= 1;
}

// GET a JSON route's text; a refusal throws an Error holding the route and what the service said. A 429 (another
// page took the places) is asked again after at most 250 ms, until BUSY_RETRY_MS have passed.
async function apiText(path, params = {}) {
  const url = apiUrl(path, params);
  const computed = COMPUTED.has(path);
  if (computed) await computePlace();
  let res;
  try {
    const until = Date.now() + BUSY_RETRY_MS;
    res = await fetch(url, { headers: { Accept: "application/json" } });
    while (res.status === 429 && Date.now() < until) {
      const hinted = 1000 * Number(res.headers.get("Retry-After") || 1);
      await sleep(Math.min(hinted, 250) * (0.5 + Math.random()));
      res = await fetch(url, { headers: { Accept: "application/json" } });
    }
  } finally {
    if (computed) leavePlace();
  }
  const text = await res.text();
  if (!res.ok) {
    let detail = text;
    try { detail = JSON.parse(text).detail ?? text; } catch { /* not JSON */ }
    const why = typeof detail === "string" ? detail : JSON.stringify(detail);
    throw new Error(`GET ${url.pathname}${url.search}: ${res.status} ${why}`);
  }
  return text;
}

function setStatus(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

// An error of a page: kept in its state's `errors` (the browser tests read them), logged, and shown.
function reportError(state, page, err) {
  const message = String((err && err.message) || err);
  state.errors.push(message);
  console.error(`trajstore ${page}: ${message}`);
  setStatus(message, true);
}
