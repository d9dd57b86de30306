// trajstore dashboard. Every number on this page comes from the public REST API (see /openapi.json):
// /ready (has the store changed?), /runs, /curves, /episodes, /episodes/{id}/steps and /returns.
"use strict";

const $ = (id) => document.getElementById(id);
const COLORS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00",
  "#b82e2e", "#316395"];
const POLL_MS = 2000;
const LAST_N = 100;               // the runs table summarises each series' latest episodes
const MAX_LINE_POINTS = 1000;     // rolling mean and band are drawn decimated beyond this
const GL_POINTS = 300;            // the learning curves switch to WebGL (faster than SVG) beyond this
const MAX_OBS_DIMS = 32;
const PLOT_CONFIG = { responsive: true, displaylogo: false };
const BANDS = { minmax: [0, 1], p10: [0.1, 0.9], p25: [0.25, 0.75], none: null };
// Columns of a step that are not numeric extras (everything else that holds numbers is plotted).
const NOT_EXTRAS = new Set(["run_id", "env_id", "episode_id", "step", "obs", "next_obs", "reward", "terminated",
  "truncated", "wall_time", "env_steps", "policy_version", "seed", "env_index", "worker_id", "mode"]);

const state = {
  version: null, runs: [], curves: [], gamma: null, hidden: new Set(),
  table: { page: 0, size: 25, sort: "-ended_at", total: 0, loads: 0, token: 0 },
  episode: null, episodeToken: 0, refreshing: null, again: false,
  timings: {}, loads: 0, points: 0, ready: false, errors: [],
};
window.trajstoreDashboard = state;  // for the browser tests, and for poking around in the console

// Plotly.js comes from the installed plotly package. The page preloads it but runs it only once the tables are
// on screen: compiling its 4.6 MB blocks the page for a while (seconds on a cold cache).
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

const nextPaint = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

// --- talking to the API -------------------------------------------------------------------------------

// Episode ids are 63-bit integers, beyond what a JavaScript number holds exactly: read them (and any other
// integer too large for a double) from the JSON source text, as strings.
const SOURCE_ACCESS = (() => {
  let ok = false;
  JSON.parse("[1]", (key, value, ctx) => { if (key === "0") ok = Boolean(ctx && ctx.source === "1"); return value; });
  return ok;
})();

function exactIntegers(key, value, ctx) {
  if (typeof value !== "number") return value;
  if (key === "episode_id") return ctx.source;
  if (Number.isInteger(value) && !Number.isSafeInteger(value) && /^-?\d+$/.test(ctx.source)) return ctx.source;
  return value;
}

function parseJson(text, exact) {
  if (!exact) return JSON.parse(text);
  if (SOURCE_ACCESS) return JSON.parse(text, exactIntegers);
  return JSON.parse(text.replace(/("episode_id"\s*:\s*)(-?\d+)/g, '$1"$2"'));  // browsers without source access
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

// GET a JSON route; `exact` keeps 63-bit integers exact (as strings), at some parsing cost.
async function api(path, params = {}, { exact = true } = {}) {
  const url = apiUrl(path, params);
  const res = await fetch(url, { headers: { Accept: "application/json" } });
  const text = await res.text();
  if (!res.ok) {
    let detail = text;
    try { detail = JSON.parse(text).detail ?? text; } catch { /* not JSON */ }
    const why = typeof detail === "string" ? detail : JSON.stringify(detail);
    throw new Error(`GET ${url.pathname}${url.search}: ${res.status} ${why}`);
  }
  return parseJson(text, exact);
}

function fail(err) {
  const message = String((err && err.message) || err);
  state.errors.push(message);
  console.error(`trajstore dashboard: ${message}`);
  setStatus(message, true);
}

function setStatus(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

// --- controls -----------------------------------------------------------------------------------------

// The γ control: null when empty; throws with a message saying what is wrong otherwise.
function gamma() {
  const raw = $("gamma").value.trim();
  $("gamma").classList.remove("invalid");
  if (raw === "") return null;
  const g = Number(raw);
  if (!(g >= 0 && g <= 1)) {
    $("gamma").classList.add("invalid");
    throw new Error(`γ must be a number in [0, 1], got ${raw}`);
  }
  return g;
}

function fmt(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return typeof x === "number" ? x.toLocaleString("en-US", { maximumFractionDigits: digits }) : String(x);
}

function when(iso) { return iso ? new Date(iso).toLocaleString("en-GB") : "–"; }

function cell(tr, content) {
  const td = document.createElement("td");
  if (content instanceof Node) td.appendChild(content); else td.textContent = content;
  tr.appendChild(td);
  return td;
}

// --- series ---------------------------------------------------------------------------------------------

const seriesKey = (s) => `${s.run_id} · ${s.env_id}`;

function seriesColor(key) {
  const keys = state.runs.flatMap((r) => r.envs.map((e) => `${r.run_id} · ${e.env_id}`));
  const i = keys.indexOf(key);
  return COLORS[(i < 0 ? keys.length : i) % COLORS.length];
}

function visibleSeries() { return state.curves.filter((s) => !state.hidden.has(seriesKey(s))); }

function returns(s) { return state.gamma !== null && s.discounted_return ? s.discounted_return : s.episode_return; }

function yValues(s, metric) { return metric === "episode_length" ? s.episode_length : returns(s); }

function returnLabel() { return state.gamma === null ? "episode return" : `discounted return (γ=${state.gamma})`; }

function summary(values) {
  if (!values.length) return {};
  let sum = 0, min = Infinity, max = -Infinity;
  for (const v of values) { sum += v; if (v < min) min = v; if (v > max) max = v; }
  const mean = sum / values.length;
  const std = Math.sqrt(values.reduce((acc, v) => acc + (v - mean) ** 2, 0) / values.length);
  return { mean, std, min, max };
}

// --- runs overview --------------------------------------------------------------------------------------

function renderRuns() {
  const body = $("runs").querySelector("tbody");
  body.innerHTML = "";
  const what = state.gamma === null ? "return" : `discounted return (γ=${state.gamma})`;
  $("runs-return").textContent = `${what}, last ${LAST_N} (mean ± std)`;
  const bySeries = new Map(state.curves.map((s) => [seriesKey(s), s]));
  for (const run of state.runs) {
    for (const env of run.envs) {
      const key = `${run.run_id} · ${env.env_id}`, s = bySeries.get(key);
      const r = s ? summary(returns(s).slice(-LAST_N)) : {};
      const len = s ? summary(s.episode_length.slice(-LAST_N)) : {};
      const tr = document.createElement("tr");
      tr.dataset.series = key;
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = !state.hidden.has(key);
      box.addEventListener("change", () => {
        if (box.checked) state.hidden.delete(key); else state.hidden.add(key);
        renderPlots().catch(fail);
      });
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = seriesColor(key);
      label.append(box, swatch);
      cell(tr, label);
      const cells = [run.run_id, env.env_id, fmt(env.complete_episodes, 0),
        fmt(env.episodes - env.complete_episodes, 0), fmt(env.steps, 0), when(env.last_write),
        r.mean === undefined ? "–" : `${fmt(r.mean)} ± ${fmt(r.std)}`, fmt(r.min), fmt(r.max), fmt(len.mean, 1)];
      for (const c of cells) cell(tr, c);
      body.appendChild(tr);
    }
  }
  if (!body.children.length) {
    body.innerHTML = '<tr><td colspan="11" class="empty">No episodes in this store yet. Write some (for example '
      + "<code>trajstore rollout</code>); this page shows them as they are committed.</td></tr>";
  }
  fillSelect($("f-run"), state.runs.map((r) => r.run_id));
  fillSelect($("f-env"), [...new Set(state.runs.flatMap((r) => r.envs.map((e) => e.env_id)))].sort());
}

function fillSelect(select, values) {
  const chosen = select.value;
  select.length = 1;  // keep "all"
  for (const v of values) select.add(new Option(v, v));
  select.value = values.includes(chosen) ? chosen : "";
}

// --- learning curves and distributions ------------------------------------------------------------------

function xValues(s, axis) {
  if (axis === "wall_time") return s.wall_time.map((t) => (t === null ? null : new Date(t * 1000)));
  if (axis === "policy_version") return s.policy_version;
  return s.env_steps;
}

function insertSorted(sorted, v) {
  let lo = 0, hi = sorted.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (sorted[mid] < v) lo = mid + 1; else hi = mid; }
  sorted.splice(lo, 0, v);
}

function removeSorted(sorted, v) {
  let lo = 0, hi = sorted.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (sorted[mid] < v) lo = mid + 1; else hi = mid; }
  sorted.splice(lo, 1);
}

function quantile(sorted, q) {
  const pos = q * (sorted.length - 1), i = Math.floor(pos), f = pos - i;
  return i + 1 < sorted.length ? sorted[i] * (1 - f) + sorted[i + 1] * f : sorted[i];
}

// Rolling mean over the last `w` values, with the band's quantiles of the same window.
function rolling(y, w, band) {
  const n = y.length, mean = new Array(n), lo = band ? new Array(n) : [], hi = band ? new Array(n) : [], win = [];
  let sum = 0;
  for (let i = 0; i < n; i++) {
    sum += y[i];
    if (band) insertSorted(win, y[i]);
    if (i >= w) { sum -= y[i - w]; if (band) removeSorted(win, y[i - w]); }
    mean[i] = sum / Math.min(i + 1, w);
    if (band) { lo[i] = quantile(win, band[0]); hi[i] = quantile(win, band[1]); }
  }
  return { mean, lo, hi };
}

// Mean and band of the episodes of each policy version (x = the versions in increasing order).
function byVersion(x, y, band) {
  const groups = new Map();
  x.forEach((v, i) => { if (v !== null) (groups.get(v) || groups.set(v, []).get(v)).push(y[i]); });
  const keys = [...groups.keys()].sort((a, b) => a - b), out = { x: keys, mean: [], lo: [], hi: [] };
  for (const k of keys) {
    const vals = groups.get(k).sort((a, b) => a - b);
    out.mean.push(vals.reduce((a, b) => a + b, 0) / vals.length);
    if (band) { out.lo.push(quantile(vals, band[0])); out.hi.push(quantile(vals, band[1])); }
  }
  return out;
}

// At most MAX_LINE_POINTS points: the last x and mean of each block, the block's extremes for the band.
function decimate(x, r) {
  const n = x.length, k = Math.ceil(n / MAX_LINE_POINTS);
  if (k <= 1) return { x, ...r };
  const out = { x: [], mean: [], lo: [], hi: [] };
  for (let a = 0; a < n; a += k) {
    const b = Math.min(n, a + k) - 1;
    out.x.push(x[b]); out.mean.push(r.mean[b]);
    if (r.lo.length) { out.lo.push(Math.min(...r.lo.slice(a, b + 1))); out.hi.push(Math.max(...r.hi.slice(a, b + 1))); }
  }
  return out;
}

// About `n` bins of a round width over all `arrays` (integer widths for integer data).
function commonBins(arrays, n = 60) {
  let lo = Infinity, hi = -Infinity, integers = true;
  for (const a of arrays) {
    for (const v of a) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
      if (integers && !Number.isInteger(v)) integers = false;
    }
  }
  if (!(hi >= lo)) return undefined;
  const raw = Math.max((hi - lo) / n, integers ? 1 : 1e-9), p = 10 ** Math.floor(Math.log10(raw));
  const size = [1, 2, 2.5, 5, 10].map((m) => m * p).find((w) => w >= raw * (1 - 1e-12));
  const start = Math.floor(lo / size) * size - (integers && size === 1 ? 0.5 : 0);
  return { start, end: hi + size, size };
}

function windowSize(n) {
  const raw = Number($("window").value);
  if (raw >= 1) return Math.floor(raw);
  return n < 10 ? 1 : Math.max(5, Math.min(200, Math.round(n / 25)));
}

function rgba(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

// The traces of one series: its band (two traces, the second filled up to the first), one marker per episode
// (opacity falling as episodes pile up) and the rolling mean, or the mean per version on the policy_version axis.
function curveTraces(s, metric, axis, band, type) {
  const key = seriesKey(s), color = seriesColor(key);
  const x = xValues(s, axis), y = yValues(s, metric), w = windowSize(y.length);
  const line = axis === "policy_version" ? byVersion(x, y, band) : decimate(x, rolling(y, w, band));
  const common = { type, legendgroup: key, hoverinfo: "skip" };
  const bandTraces = band ? [  // SVG: WebGL fills do not draw; the WebGL canvas lies above, so markers cover it
    { ...common, type: "scatter", x: line.x, y: line.hi, mode: "lines", line: { width: 0, color }, showlegend: false,
      name: `${key} band` },
    { ...common, type: "scatter", x: line.x, y: line.lo, mode: "lines", line: { width: 0, color }, fill: "tonexty",
      fillcolor: rgba(color, 0.18), showlegend: false, name: `${key} band` },
  ] : [];
  const opacity = Math.min(0.45, Math.max(0.06, 0.45 * Math.sqrt(1000 / Math.max(1, y.length))));
  const points = { ...common, x, y, mode: "markers", marker: { size: y.length > 5000 ? 3 : 4, color, opacity },
    name: `${key} episodes`, showlegend: false, meta: { kind: "episodes", key }, customdata: s.episode_id,
    hoverinfo: undefined, hovertemplate: `${key}<br>episode %{customdata}<br>%{y:.4~g}<extra></extra>` };
  const mean = { ...common, x: line.x, y: line.mean, mode: axis === "policy_version" ? "lines+markers" : "lines",
    line: { color, width: 2.5 },
    name: axis === "policy_version" ? `${key} (mean per version)` : `${key} (rolling mean of ${w})` };
  return { band: bandTraces, points, mean };
}

async function renderPlots() {
  const Plotly = await plotlyReady();
  const metric = $("metric").value, axis = $("xaxis").value, band = BANDS[$("band").value];
  const shown = visibleSeries().filter((s) => axis !== "policy_version" || s.policy_version.some((v) => v !== null));
  const yTitle = metric === "episode_length" ? "episode length" : returnLabel();
  const empty = !shown.length ? note(axis === "policy_version" && visibleSeries().length
    ? "no policy_version stored for the runs shown" : "no complete episodes to show") : [];
  // One kind of trace for the whole plot: WebGL traces are drawn above SVG ones whatever their order.
  const total = shown.reduce((n, s) => n + s.episode_id.length, 0), type = total > GL_POINTS ? "scattergl" : "scatter";
  const parts = shown.map((s) => curveTraces(s, metric, axis, band, type));
  const traces = [...parts.flatMap((p) => p.band), ...parts.map((p) => p.points), ...parts.map((p) => p.mean)];
  await Plotly.react("curves", traces, {
    margin: { t: 30, r: 20, b: 50, l: 60 }, uirevision: `${metric}/${axis}`, annotations: empty,
    xaxis: { title: { text: $("xaxis").selectedOptions[0].text } }, yaxis: { title: { text: yTitle } },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, hovermode: "closest",
  }, PLOT_CONFIG);
  if (!state.curvesClickable) {  // Plotly adds .on() to the div at its first plot
    $("curves").on("plotly_click", (ev) => {
      const point = ev.points.find((p) => p.data.meta && p.data.meta.kind === "episodes");
      if (point) showEpisode(point.customdata).catch(fail);
    });
    state.curvesClickable = true;
  }
  const hist = (id, values, title) => {
    const xbins = commonBins(shown.map(values));  // Plotly's own binning sorts every value: slow at 100k
    return Plotly.react(id, shown.map((s) => ({
      x: values(s), type: "histogram", xbins, opacity: 0.55, name: seriesKey(s),
      marker: { color: seriesColor(seriesKey(s)) },
    })), { barmode: "overlay", margin: { t: 10, r: 10, b: 45, l: 55 }, xaxis: { title: { text: title } },
    yaxis: { title: { text: "episodes" } }, showlegend: shown.length > 1, legend: { orientation: "h", y: -0.25 },
    annotations: shown.length ? [] : note("no complete episodes") }, PLOT_CONFIG);
  };
  await Promise.all([hist("hist-return", returns, returnLabel()),
    hist("hist-length", (s) => s.episode_length, "episode length")]);
}

// --- episodes table ---------------------------------------------------------------------------------------

function episodeFilters() {
  const end = $("f-end").value;
  return {
    run_id: $("f-run").value, env_id: $("f-env").value, min_return: $("f-min").value, max_return: $("f-max").value,
    complete: end === "complete" ? true : end === "unfinished" ? false : undefined,
    terminated: end === "terminated" ? true : undefined, truncated: end === "truncated" ? true : undefined,
  };
}

async function loadEpisodes() {
  const t = state.table, g = state.gamma, token = ++t.token;
  const payload = await api("/episodes", { ...episodeFilters(), order_by: t.sort, limit: t.size,
    offset: t.page * t.size, gamma: g });
  if (token !== t.token) return;  // a later request (another page, sort or filter) won
  t.total = payload.total;
  const body = $("episodes").querySelector("tbody");
  body.innerHTML = "";
  for (const th of $("episodes").querySelectorAll("th.discounted")) {
    th.hidden = g === null;
    th.textContent = `discounted return (γ=${g})`;
  }
  for (const ep of payload.items) {
    const tr = document.createElement("tr");
    tr.dataset.episodeId = ep.episode_id;
    tr.classList.toggle("selected", state.episode !== null && state.episode.id === ep.episode_id);
    for (const c of [ep.episode_id, ep.run_id, ep.env_id, fmt(ep.episode_return, 3)]) cell(tr, c);
    if (g !== null) cell(tr, fmt(ep.discounted_return, 3));
    for (const c of [fmt(ep.episode_length, 0), ep.terminated ? "✓" : "", ep.truncated ? "✓" : "",
      fmt(ep.policy_version, 0), when(ep.ended_at)]) cell(tr, c);
    tr.addEventListener("click", () => showEpisode(ep.episode_id).catch(fail));
    body.appendChild(tr);
  }
  if (!payload.items.length) body.innerHTML = '<tr><td colspan="10" class="empty">no episodes match</td></tr>';
  const pages = Math.max(1, Math.ceil(t.total / t.size));
  $("page").textContent = `page ${fmt(t.page + 1, 0)} of ${fmt(pages, 0)} · ${fmt(t.total, 0)} episodes`;
  $("first").disabled = $("prev").disabled = t.page === 0;
  $("next").disabled = $("last").disabled = t.page + 1 >= pages;
  for (const th of $("episodes").querySelectorAll("th[data-sort]")) {
    const key = th.dataset.sort;
    th.className = t.sort === key ? "sorted-asc" : t.sort === `-${key}` ? "sorted-desc" : "";
  }
  t.loads += 1;
}

function goToPage(page) {
  state.table.page = Math.max(0, Math.min(page, Math.ceil(state.table.total / state.table.size) - 1));
  loadEpisodes().catch(fail);
}

// --- one episode ------------------------------------------------------------------------------------------

function flatten(value, out = []) {
  if (Array.isArray(value)) for (const v of value) flatten(v, out);
  else if (value !== null && typeof value === "object") for (const v of Object.values(value)) flatten(v, out);
  else out.push(typeof value === "number" ? value : null);
  return out;
}

// A grey message in the middle of an empty plot.
function note(text) {
  return [{ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
    font: { size: 14, color: "#6b7385" } }];
}

function stepPlotLayout(extra = {}) {
  return { margin: { t: 10, r: 60, b: 40, l: 60 }, xaxis: { title: { text: "step" } },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, ...extra };
}

function rewardPlot(Plotly, steps, rtgRows, g) {
  return Plotly.react("ep-reward", [
    { x: steps.map((r) => r.step), y: steps.map((r) => r.reward), type: "scatter", mode: "lines", name: "reward",
      line: { color: "#3366cc" } },
    { x: rtgRows.map((r) => r.step), y: rtgRows.map((r) => r.return_to_go), type: "scatter", mode: "lines",
      name: `return-to-go (γ=${g})`, yaxis: "y2", line: { color: "#dc3912" } },
  ], stepPlotLayout({ yaxis: { title: { text: "reward" } },
    yaxis2: { overlaying: "y", side: "right", title: { text: `return-to-go (γ=${g})` }, showgrid: false } }),
  PLOT_CONFIG);
}

// One subplot per numeric extra (value, log_prob, …) and the action when it is a number, sharing the step axis.
function extrasPlot(Plotly, steps) {
  const last = steps[steps.length - 1], t = steps.map((r) => r.step);
  const names = Object.keys(last).filter((k) => !NOT_EXTRAS.has(k) && steps.some((r) => typeof r[k] === "number"));
  const n = Math.max(1, names.length), gap = 0.06, h = (1 - gap * (n - 1)) / n;
  const layout = stepPlotLayout({ showlegend: false, height: Math.max(240, 130 * n) });
  names.forEach((k, i) => {
    const ax = i === 0 ? "" : String(i + 1);
    layout[`yaxis${ax}`] = { domain: [i * (h + gap), i * (h + gap) + h], title: { text: k } };
    if (i > 0) layout[`xaxis${ax}`] = { matches: "x", anchor: `y${ax}`, showticklabels: false };
  });
  layout.xaxis = { ...layout.xaxis, anchor: "y" };
  if (!names.length) layout.annotations = note("no numeric extras stored (value, log_prob, …)");
  $("ep-extras").style.height = `${layout.height}px`;
  return Plotly.react("ep-extras", names.map((k, i) => ({
    x: t, y: steps.map((r) => r[k]), type: "scatter", mode: "lines", name: k,
    xaxis: i ? `x${i + 1}` : "x", yaxis: i ? `y${i + 1}` : "y",
    line: { color: COLORS[(i + 2) % COLORS.length], shape: k === "action" ? "hv" : "linear" },
  })), layout, PLOT_CONFIG);
}

// Every dimension of the observation (nested lists and Dict spaces flattened), up to MAX_OBS_DIMS.
function observationPlot(Plotly, steps) {
  const obs = steps.map((r) => flatten(r.obs)), t = steps.map((r) => r.step);
  const all = obs.length ? obs[0].length : 0, dims = Math.min(all, MAX_OBS_DIMS);
  const cut = all > dims ? [{ text: `first ${dims} of ${all} dimensions`, showarrow: false, xref: "paper",
    yref: "paper", x: 1, y: 1, xanchor: "right" }] : [];
  return Plotly.react("ep-obs", Array.from({ length: dims }, (_, d) => ({
    x: t, y: obs.map((o) => o[d]), type: "scatter", mode: "lines", name: `obs[${d}]`,
  })), stepPlotLayout({ yaxis: { title: { text: "observation" } }, showlegend: true, annotations: cut }), PLOT_CONFIG);
}

// Open one episode: its steps and return-to-go (for the chosen γ, 0.99 when none) from the API, then three plots.
async function showEpisode(id) {
  const t0 = performance.now(), token = ++state.episodeToken;
  const g = state.gamma === null ? 0.99 : state.gamma;
  const [stepsPage, rtgRows] = await Promise.all([
    api(`/episodes/${encodeURIComponent(id)}/steps`),
    api("/returns", { per: "step", episode_id: id, gamma: g, limit: 100000 }),
  ]);
  if (token !== state.episodeToken) return;  // a later click won
  const Plotly = await plotlyReady(), steps = stepsPage.steps, last = steps[steps.length - 1];
  const end = last.terminated ? "terminated" : last.truncated ? "truncated" : "unfinished";
  const total = steps.reduce((acc, r) => acc + r.reward, 0);
  state.episode = { id, steps: steps.length, gamma: g, complete: end !== "unfinished" };
  $("episode").hidden = false;
  $("episode-title").textContent = `Episode ${id} · ${last.run_id} · ${last.env_id} · `
    + `${fmt(steps.length, 0)} steps · return ${fmt(total, 3)} · ${end}`;
  for (const tr of $("episodes").querySelectorAll("tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.episodeId === id);
  }
  await Promise.all([rewardPlot(Plotly, steps, rtgRows, g), extrasPlot(Plotly, steps), observationPlot(Plotly, steps)]);
  await nextPaint();
  state.timings.episode_ms = performance.now() - t0;
  $("episode").scrollIntoView({ block: "start" });
}

function closeEpisode() {
  state.episode = null;
  state.episodeToken += 1;
  $("episode").hidden = true;
  for (const tr of $("episodes").querySelectorAll("tbody tr.selected")) tr.classList.remove("selected");
}

// --- loading and live updates -------------------------------------------------------------------------------

async function load() {
  const t0 = performance.now(), g = gamma(), first = state.loads === 0;
  const ready = await api("/ready", {}, { exact: false });  // the version first: data read later is never older
  state.gamma = g;
  const curves = api("/curves", { gamma: g }, { exact: false });
  // On the first load the tables go on screen as soon as they can; the runs' latest-episode stats follow the curves.
  const runs = api("/runs").then((r) => { state.runs = r; if (first) renderRuns(); });
  const table = loadEpisodes();
  const tables = Promise.all([runs, table]).then(async () => {
    if (first) { await nextPaint(); performance.mark("trajstore-tables"); }
  });
  if (first) tables.then(plotlyReady).catch(() => {});  // runs while /curves may still be on its way
  const [c] = await Promise.all([curves, runs, table, tables]);
  state.version = ready.version;
  state.curves = c.series;
  state.points = state.curves.reduce((n, s) => n + s.episode_id.length, 0);
  renderRuns();
  await renderPlots();
  await nextPaint();
  if (!state.loads) performance.mark("trajstore-plots");
  if (state.episode && !state.episode.complete) await showEpisode(state.episode.id);  // it may have grown
  state.loads += 1;
  state.timings.load_ms = performance.now() - t0;
  const series = state.curves.length;
  setStatus(`${fmt(state.points, 0)} complete episodes in ${series} series · store v${ready.version} · `
    + `${new Date().toLocaleTimeString("en-GB")}`);
}

// Reload everything; calls made while a reload runs are folded into one more reload after it.
function refresh() {
  if (state.refreshing) { state.again = true; return state.refreshing; }
  state.refreshing = (async () => {
    try {
      do { state.again = false; await load(); } while (state.again);
    } finally { state.refreshing = null; }
  })();
  return state.refreshing;
}

async function poll() {
  try {
    if ($("live").checked && !document.hidden && !state.refreshing) {
      const ready = await api("/ready", {}, { exact: false });
      if (ready.version !== state.version) await refresh();
    }
  } catch (err) { fail(err); }
  setTimeout(poll, Math.max(POLL_MS, 2 * (state.timings.load_ms || 0)));
}

function wire() {
  for (const id of ["metric", "xaxis", "band", "window"]) {
    $(id).addEventListener("change", () => renderPlots().catch(fail));
  }
  $("gamma").addEventListener("change", () => {
    refresh().then(() => state.episode && showEpisode(state.episode.id)).catch(fail);
  });
  $("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.table.page = 0;
    state.table.size = Number($("f-size").value);
    loadEpisodes().catch(fail);
  });
  for (const id of ["f-run", "f-env", "f-end", "f-size"]) {
    $(id).addEventListener("change", () => $("filters").requestSubmit());
  }
  $("first").addEventListener("click", () => goToPage(0));
  $("prev").addEventListener("click", () => goToPage(state.table.page - 1));
  $("next").addEventListener("click", () => goToPage(state.table.page + 1));
  $("last").addEventListener("click", () => goToPage(Infinity));
  for (const th of $("episodes").querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.table.sort = state.table.sort === `-${key}` ? key : `-${key}`;
      state.table.page = 0;
      loadEpisodes().catch(fail);
    });
  }
  $("episode-close").addEventListener("click", closeEpisode);
}

wire();
refresh()
  .then(() => { state.ready = true; performance.mark("trajstore-ready"); })
  .catch(fail)
  .finally(() => setTimeout(poll, POLL_MS));
