// trajstore dashboard: every number on this page comes from the public REST API (see /openapi.json).
"use strict";

const state = {
  curves: [], runs: [], hidden: new Set(), page: 0, pageSize: 25, sort: "-ended_at",
  episode: null, lastSignature: null, timings: {}, loads: 0,
};
window.trajstoreDashboard = state;
const $ = (id) => document.getElementById(id);
const COLORS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00"];

// Episode ids are 63-bit integers: keep them as strings so JavaScript numbers never round them.
function parseJson(text) {
  return JSON.parse(text.replace(/("episode_id"\s*:\s*)(-?\d{16,})/g, '$1"$2"'));
}

async function api(path, params) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v === undefined || v === null || v === "") continue;
    for (const item of [].concat(v)) url.searchParams.append(k, item);
  }
  const res = await fetch(url, { headers: { Accept: "application/json" } });
  const text = await res.text();
  if (!res.ok) {
    let detail = text;
    try { detail = JSON.parse(text).detail || text; } catch (e) { /* not JSON */ }
    throw new Error(`${path}: ${res.status} ${detail}`);
  }
  return parseJson(text);
}

function rowsOf(payload) {
  if (Array.isArray(payload)) return payload;
  for (const key of ["items", "episodes", "runs", "steps", "rows", "data"]) {
    if (Array.isArray(payload[key])) return payload[key];
  }
  return [];
}

function gamma() {
  const g = $("gamma").value;
  return g === "" ? null : Number(g);
}

function setStatus(text) { $("status").textContent = text; }

function fmt(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return typeof x === "number" ? x.toLocaleString(undefined, { maximumFractionDigits: digits }) : String(x);
}

// --- runs overview -----------------------------------------------------------------------------

function lastStats(runId) {
  const vals = [], lens = [];
  for (const s of state.curves.filter((c) => c.run_id === runId)) {
    vals.push(...yValues(s, "episode_return").slice(-100));
    lens.push(...s.episode_length.slice(-100));
  }
  if (!vals.length) return {};
  const mean = (a) => a.reduce((p, q) => p + q, 0) / a.length;
  return { mean: mean(vals), min: Math.min(...vals), max: Math.max(...vals), len: mean(lens) };
}

function renderRuns() {
  const body = $("runs").querySelector("tbody");
  body.innerHTML = "";
  const select = $("f-run"), chosen = select.value;
  select.innerHTML = '<option value="">all</option>';
  for (const run of state.runs) {
    const st = lastStats(run.run_id);
    const envs = (run.envs || []).map((e) => (typeof e === "string" ? e : e.env_id)).join(", ");
    const tr = document.createElement("tr");
    const cells = [run.run_id, envs, fmt(run.episodes, 0), fmt(run.steps, 0),
      run.last_write ? new Date(run.last_write).toLocaleString() : "–",
      fmt(st.mean), fmt(st.min), fmt(st.max), fmt(st.len, 1)];
    const box = document.createElement("input");
    box.type = "checkbox"; box.checked = !state.hidden.has(run.run_id);
    box.addEventListener("change", () => {
      if (box.checked) state.hidden.delete(run.run_id); else state.hidden.add(run.run_id);
      renderPlots();
    });
    const td0 = document.createElement("td"); td0.appendChild(box); tr.appendChild(td0);
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
    body.appendChild(tr);
    const opt = document.createElement("option"); opt.value = opt.textContent = run.run_id;
    select.appendChild(opt);
  }
  select.value = chosen;
}

// --- learning curves and distributions ----------------------------------------------------------

function yValues(series, metric) {
  if (metric === "episode_return" && gamma() !== null && series.discounted_return) return series.discounted_return;
  return series[metric];
}

function xValues(series, axis) {
  if (axis === "wall_time") return series.wall_time.map((t) => new Date(t * 1000));
  if (axis === "policy_version" && series.policy_version) return series.policy_version;
  return series.env_steps;
}

function rolling(y, window) {
  const mean = new Array(y.length), lo = new Array(y.length), hi = new Array(y.length);
  let sum = 0;
  for (let i = 0; i < y.length; i++) {
    sum += y[i];
    if (i >= window) sum -= y[i - window];
    const start = Math.max(0, i - window + 1);
    mean[i] = sum / (i - start + 1);
    let a = Infinity, b = -Infinity;
    for (let j = start; j <= i; j++) { if (y[j] < a) a = y[j]; if (y[j] > b) b = y[j]; }
    lo[i] = a; hi[i] = b;
  }
  return { mean, lo, hi };
}

function visibleSeries() { return state.curves.filter((s) => !state.hidden.has(s.run_id)); }

function renderPlots() {
  const metric = $("metric").value, axis = $("xaxis").value;
  const traces = [];
  visibleSeries().forEach((s, i) => {
    const color = COLORS[i % COLORS.length], name = `${s.run_id} · ${s.env_id}`;
    const x = xValues(s, axis), y = yValues(s, metric);
    const window = Math.max(1, Math.min(100, Math.round(y.length / 20)));
    const r = rolling(y, window);
    traces.push({ x, y: r.hi, type: "scattergl", mode: "lines", line: { width: 0 }, hoverinfo: "skip",
      showlegend: false, legendgroup: name, name: `${name} max` });
    traces.push({ x, y: r.lo, type: "scattergl", mode: "lines", line: { width: 0 }, fill: "tonexty",
      fillcolor: color + "22", hoverinfo: "skip", showlegend: false, legendgroup: name, name: `${name} min` });
    traces.push({ x, y, type: "scattergl", mode: "markers", marker: { size: 3, color, opacity: 0.35 },
      name: `${name} episodes`, legendgroup: name, meta: "episodes", customdata: s.episode_id,
      hovertemplate: "episode %{customdata}<br>%{y}<extra></extra>" });
    traces.push({ x, y: r.mean, type: "scattergl", mode: "lines", line: { color, width: 2 },
      name: `${name} rolling mean (${window})`, legendgroup: name });
  });
  const yTitle = metric === "episode_length" ? "episode length"
    : gamma() !== null ? `discounted return (γ=${gamma()})` : "episode return";
  Plotly.react("curves", traces, {
    margin: { t: 10, r: 10 }, xaxis: { title: { text: $("xaxis").selectedOptions[0].text } },
    yaxis: { title: { text: yTitle } }, legend: { orientation: "h" },
  }, { responsive: true });
  const hist = (id, key, title) => Plotly.react(id, visibleSeries().map((s, i) => ({
    x: key === "episode_return" ? yValues(s, key) : s[key], type: "histogram", opacity: 0.6,
    name: s.run_id, marker: { color: COLORS[i % COLORS.length] },
  })), { barmode: "overlay", margin: { t: 10, r: 10 }, xaxis: { title: { text: title } } }, { responsive: true });
  hist("hist-return", "episode_return", yTitle === "episode length" ? "episode return" : yTitle);
  hist("hist-length", "episode_length", "episode length");
}

// --- episodes table -------------------------------------------------------------------------------

function episodeFilters() {
  const end = $("f-end").value;
  return {
    run_id: $("f-run").value, env_id: $("f-env").value,
    min_return: $("f-min").value, max_return: $("f-max").value,
    terminated: end === "terminated" ? true : undefined, truncated: end === "truncated" ? true : undefined,
    complete: end === "incomplete" ? false : undefined,
  };
}

async function loadEpisodes() {
  const payload = await api("/episodes", {
    ...episodeFilters(), order_by: state.sort, limit: state.pageSize, offset: state.page * state.pageSize,
  });
  const rows = rowsOf(payload);
  const body = $("episodes").querySelector("tbody");
  body.innerHTML = "";
  for (const ep of rows) {
    const tr = document.createElement("tr");
    tr.dataset.episodeId = String(ep.episode_id);
    const cells = [ep.episode_id, ep.run_id, ep.env_id, fmt(ep.episode_return, 3), fmt(ep.episode_length, 0),
      ep.terminated ? "✓" : "", ep.truncated ? "✓" : "", ep.ended_at ? new Date(ep.ended_at).toLocaleString() : ""];
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
    tr.addEventListener("click", () => showEpisode(String(ep.episode_id)));
    body.appendChild(tr);
  }
  const total = payload.total;
  $("page").textContent = `page ${state.page + 1}` + (total !== undefined ? ` of ${Math.max(1, Math.ceil(total / state.pageSize))} (${total} episodes)` : "");
  $("prev").disabled = state.page === 0;
  $("next").disabled = total !== undefined ? (state.page + 1) * state.pageSize >= total : rows.length < state.pageSize;
  for (const th of $("episodes").querySelectorAll("th[data-sort]")) {
    const key = th.dataset.sort;
    th.className = state.sort === key ? "sorted-asc" : state.sort === "-" + key ? "sorted-desc" : "";
  }
}

// --- one episode ----------------------------------------------------------------------------------

function column(rows, key) { return rows.map((r) => r[key]); }

async function showEpisode(episodeId) {
  const t0 = performance.now();
  state.episode = episodeId;
  const g = gamma() === null ? 0.99 : gamma();
  const [stepsPayload, rtgPayload] = await Promise.all([
    api(`/episodes/${episodeId}/steps`, {}),
    api("/returns", { per: "step", episode_id: episodeId, gamma: g }),
  ]);
  const steps = rowsOf(stepsPayload), rtg = rowsOf(rtgPayload);
  const t = column(steps, "step");
  $("episode").hidden = false;
  $("episode-title").textContent = `Episode ${episodeId} — ${steps.length} steps`;
  Plotly.react("ep-reward", [
    { x: t, y: column(steps, "reward"), type: "scatter", mode: "lines", name: "reward" },
    { x: column(rtg, "step"), y: column(rtg, "return_to_go"), type: "scatter", mode: "lines",
      name: `return-to-go (γ=${g})`, yaxis: "y2" },
  ], { margin: { t: 10, r: 40 }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: "reward" } },
    yaxis2: { overlaying: "y", side: "right", title: { text: "return-to-go" } }, legend: { orientation: "h" } });
  const skip = new Set(["step", "reward", "episode_id", "env_index", "policy_version", "seed", "terminated", "truncated"]);
  const extras = steps.length ? Object.keys(steps[0]).filter((k) => !skip.has(k) && typeof steps[0][k] === "number") : [];
  Plotly.react("ep-extras", extras.map((k) => ({ x: t, y: column(steps, k), type: "scatter", mode: "lines", name: k })),
    { margin: { t: 10, r: 10 }, xaxis: { title: { text: "step" } }, legend: { orientation: "h" },
      annotations: extras.length ? [] : [{ text: "no numeric extras stored", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] });
  const obs = steps.map((r) => [].concat(r.obs === undefined ? [] : r.obs).flat(Infinity));
  const dims = obs.length ? obs[0].length : 0;
  Plotly.react("ep-obs", Array.from({ length: Math.min(dims, 16) }, (_, d) => ({
    x: t, y: obs.map((o) => o[d]), type: "scatter", mode: "lines", name: `obs[${d}]`,
  })), { margin: { t: 10, r: 10 }, xaxis: { title: { text: "step" } }, legend: { orientation: "h" } });
  state.timings.episode_ms = performance.now() - t0;
  state.episodeSteps = steps.length;
  $("episode").scrollIntoView({ block: "nearest" });
}

// --- loading and live updates ------------------------------------------------------------------------

async function loadAll() {
  const t0 = performance.now();
  const [runs, curves] = await Promise.all([api("/runs", {}), api("/curves", { gamma: gamma() })]);
  state.runs = rowsOf(runs);
  state.curves = curves.series;
  state.signature = signature(state.runs);
  renderRuns();
  renderPlots();
  await loadEpisodes();
  state.loads += 1;
  state.timings.load_ms = performance.now() - t0;
  state.points = state.curves.reduce((n, s) => n + s.episode_id.length, 0);
  setStatus(`${state.points} episodes · updated ${new Date().toLocaleTimeString()}`);
}

function signature(runs) {
  return JSON.stringify(runs.map((r) => [r.run_id, r.steps, r.episodes, r.last_write]));
}

async function poll() {
  if ($("live").checked && !document.hidden) {
    try {
      const runs = rowsOf(await api("/runs", {}));
      if (signature(runs) !== state.signature) await loadAll();
    } catch (err) { setStatus(String(err.message || err)); }
  }
  setTimeout(poll, 2000);
}

function wire() {
  for (const id of ["metric", "xaxis"]) $(id).addEventListener("change", renderPlots);
  $("gamma").addEventListener("change", () => loadAll().catch((e) => setStatus(e.message)));
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); state.page = 0; loadEpisodes(); });
  $("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); loadEpisodes(); });
  $("next").addEventListener("click", () => { state.page += 1; loadEpisodes(); });
  for (const th of $("episodes").querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.sort = state.sort === "-" + key ? key : "-" + key;
      state.page = 0;
      loadEpisodes();
    });
  }
}

wire();
loadAll().then(() => { state.ready = true; setTimeout(poll, 2000); })
  .catch((err) => { setStatus(String(err.message || err)); state.error = String(err); });
