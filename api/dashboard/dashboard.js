// trajstore dashboard. Every number on this page comes from the public REST API (see /openapi.json):
// /events (commits, pushed), /ready, /runs (with each series' latest episodes summarised by the service),
// /curves/binned, /curves/histogram, /stats, /episodes,
// /episodes/{id}/steps and /returns; /curves (every episode) only for small stores; /schema?env_id= (which
// observation leaves are pictures) and /episodes/{id}/frames (one step's picture, a PNG drawn by the service)
// when an episode is opened; nothing about frames for environments without pictures.
"use strict";

const POLL_MS = 2000;
const LAST_N = 100;               // the runs table summarises each series' latest episodes (/runs?last=)
const POINTS_LIMIT = 5000;        // one marker per episode (SVG) up to this many complete episodes; bins only beyond
const PLOTLY_AFTER_MS = 700;      // first load: Plotly.js is run after the curves' sketch, or after this long a wait
const MAX_BINS = 2000;            // bins of the curves: about the plot's width in pixels, at most this
const HIST_BINS = 60;
const MAX_OBS_DIMS = 32;
const FRAME_BOX_PX = 320;         // the frame player's width on screen (CSS pixels)
const FRAME_MAX_PX = 640;         // the largest picture asked for (the service caps it at its max_frame_size)
// Columns of a step that are not numeric extras (everything else that holds numbers is plotted).
const NOT_EXTRAS = new Set(["run_id", "env_id", "episode_id", "agent_id", "step", "obs", "next_obs", "reward",
  "terminated", "truncated", "wall_time", "env_steps", "policy_version", "seed", "env_index", "worker_id", "mode"]);

const state = {
  version: null, runs: [], curves: [], binned: null, hists: {}, stats: [], gamma: null, hidden: new Set(),
  urlRuns: null, events: 0,
  table: { page: 0, size: 25, sort: "-ended_at", total: 0, loads: 0, token: 0 },
  episode: null, episodeToken: 0, refreshing: null, again: false, schemas: new Map(), frame: null,
  source: null, polling: null,
  timings: {}, loads: 0, points: 0, ready: false, errors: [],
};
window.trajstoreDashboard = state;  // for the browser tests, and for poking around in the console

const nextPaint = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

// --- talking to the API -------------------------------------------------------------------------------

// Every JSON answer of the service is exact as it stands: episode ids (63-bit, past what a JavaScript number
// holds) come as decimal strings, as does any other integer beyond Number.MAX_SAFE_INTEGER. The page keeps ids
// as those strings and puts them in URLs unchanged.
async function api(path, params = {}) {
  return JSON.parse(await apiText(path, params));
}

function fail(err) {
  reportError(state, "dashboard", err);
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

// A series' latest episodes as the service summarised them (/runs?last=): the return (discounted with γ) and
// length statistics, or {} when the series has no complete episode.
function latest(env) {
  const l = env.latest;
  if (!l) return { r: {}, len: {} };
  const p = state.gamma !== null && l.discounted_return_mean !== null ? "discounted_return" : "return";
  return { r: { mean: l[`${p}_mean`], std: l[`${p}_std`], min: l[`${p}_min`], max: l[`${p}_max`] },
    len: { mean: l.len_mean } };
}

// --- runs overview --------------------------------------------------------------------------------------

function renderRuns() {
  const body = $("runs").querySelector("tbody");
  body.innerHTML = "";
  const what = state.gamma === null ? "return" : `discounted return (γ=${state.gamma})`;
  $("runs-return").textContent = `${what}, last ${LAST_N} (mean ± std)`;
  for (const run of state.runs) {
    for (const env of run.envs) {
      const key = `${run.run_id} · ${env.env_id}`, { r, len } = latest(env);
      const tr = document.createElement("tr");
      tr.dataset.series = key;
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = !state.hidden.has(key);
      box.addEventListener("change", () => {
        if (box.checked) state.hidden.delete(key); else state.hidden.add(key);
        saveUrl();
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
// The service bins the curves (/curves/binned: per bin the mean and 10/50/90 percentiles) and the histograms
// (/curves/histogram), so what the page fetches does not grow with the number of episodes. Only for a small
// store (POINTS_LIMIT complete episodes) does it also fetch /curves and draw one marker per episode.

function binCount() { return Math.max(50, Math.min(MAX_BINS, Math.round($("curves").clientWidth || 800))); }

function xMid(b, i, axis) {
  const mid = (b.lo[i] + b.hi[i]) / 2;
  return axis === "wall_time" ? new Date(mid * 1000) : mid;
}

function xValues(s, axis) {
  if (axis === "wall_time") return s.wall_time.map((t) => (t === null ? null : new Date(t * 1000)));
  if (axis === "policy_version") return s.policy_version;
  if (axis === "episode_index") return s.episode_id.map((_, i) => i);
  return s.env_steps;
}

// The traces of one series' bins: its p10–p90 band (two traces, the second filled up to the first) and the mean.
function binnedTraces(b, axis, band) {
  const key = seriesKey(b), color = seriesColor(key), x = b.bin.map((_, i) => xMid(b, i, axis));
  const common = { type: "scatter", legendgroup: key, hoverinfo: "skip", meta: { kind: "binned", key } };
  const bandTraces = band ? [
    { ...common, x, y: b.p90, mode: "lines", line: { width: 0, color }, showlegend: false, name: `${key} p90` },
    { ...common, x, y: b.p10, mode: "lines", line: { width: 0, color }, fill: "tonexty",
      fillcolor: rgba(color, 0.18), showlegend: false, name: `${key} p10–p90` },
  ] : [];
  const mean = { ...common, x, y: b.mean, mode: b.bin.length < 30 ? "lines+markers" : "lines",
    line: { color, width: 2.5 }, name: key, meta: { kind: "mean", key }, customdata: b.count,
    hoverinfo: undefined, hovertemplate: `${key}<br>mean %{y:.4~g} of %{customdata} episodes<extra></extra>` };
  return { band: bandTraces, mean };
}

// One marker per complete episode (small stores only), opacity falling as episodes pile up.
function pointTraces(s, metric, axis) {
  const key = seriesKey(s), color = seriesColor(key), y = yValues(s, metric);
  const opacity = Math.min(0.45, Math.max(0.06, 0.45 * Math.sqrt(1000 / Math.max(1, y.length))));
  return { type: "scatter", x: xValues(s, axis), y, mode: "markers", legendgroup: key,
    marker: { size: y.length > 5000 ? 3 : 4, color, opacity }, name: `${key} episodes`, showlegend: false,
    meta: { kind: "episodes", key }, customdata: s.episode_id,
    hovertemplate: `${key}<br>episode %{customdata}<br>%{y:.4~g}<extra></extra>` };
}

const shownKey = (s) => !state.hidden.has(seriesKey(s));

async function renderPlots() {
  const Plotly = await plotlyReady();
  unsketch($("curves"));
  const metric = $("metric").value, axis = $("xaxis").value, band = $("band").value !== "none";
  const binned = (state.binned ? state.binned.series : []).filter(shownKey);
  const points = state.curves.filter(shownKey)
    .filter((s) => axis !== "policy_version" || s.policy_version.some((v) => v !== null));
  const yTitle = metric === "episode_length" ? "episode length" : returnLabel();
  const empty = !binned.length ? note(axis === "policy_version" && state.curves.length
    ? "no policy_version stored for the runs shown" : "no complete episodes to show") : [];
  const parts = binned.map((b) => binnedTraces(b, axis, band));
  const traces = [...parts.flatMap((p) => p.band), ...points.map((s) => pointTraces(s, metric, axis)),
    ...parts.map((p) => p.mean)];
  await Plotly.react("curves", traces, {
    margin: { t: 30, r: 20, b: 50, l: 60 }, uirevision: `${metric}/${axis}`, annotations: empty,
    xaxis: { title: { text: $("xaxis").selectedOptions[0].text } }, yaxis: { title: { text: yTitle } },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, hovermode: "closest", showlegend: true,
  }, PLOT_CONFIG);
  if (!state.curvesClickable) {  // Plotly adds .on() to the div at its first plot
    $("curves").on("plotly_click", (ev) => {
      const point = ev.points.find((p) => p.data.meta && p.data.meta.kind === "episodes");
      if (point) showEpisode(point.customdata, point.data.meta.key.split(" · ").slice(1).join(" · ")).catch(fail);
    });
    state.curvesClickable = true;
  }
  // Counts, or densities (each series' bars integrate to 1: a 500-episode run is as visible as a 22k one).
  const density = $("density").checked;
  const hist = (id, h, title) => {
    const shown = (h ? h.series : []).filter(shownKey);
    return Plotly.react(id, shown.map((b) => ({
      type: "bar", x: b.bin.map((_, i) => (b.lo[i] + b.hi[i]) / 2), y: density ? b.density : b.count,
      width: b.bin.map((_, i) => b.hi[i] - b.lo[i]),
      opacity: 0.55, name: seriesKey(b), marker: { color: seriesColor(seriesKey(b)) },
    })), { barmode: "overlay", bargap: 0, margin: { t: 10, r: 10, b: 45, l: 55 }, xaxis: { title: { text: title } },
    yaxis: { title: { text: density ? "density" : "episodes" } }, showlegend: shown.length > 1,
    legend: { orientation: "h", y: -0.25 },
    annotations: shown.length ? [] : note("no complete episodes") }, PLOT_CONFIG);
  };
  await Promise.all([hist("hist-return", state.hists.ret, returnLabel()),
    hist("hist-length", state.hists.len, "episode length")]);
  renderCompare();
  await renderAgentCurves(Plotly, axis, band);
}

// Learning curves per agent (or group of agents) of the multi-agent runs: each agent's own return (undiscounted)
// or length per bin, one colour per agent; the section shows only where a run holds multi-agent episodes.
function renderAgentCurves(Plotly, axis, band) {
  const all = state.agentCurves ? state.agentCurves.series : [];
  $("agents-section").hidden = all.length === 0;
  if (!all.length) return Promise.resolve();
  const agents = [...new Set(all.map((s) => s.agent))].sort();
  const shown = all.filter(shownKey), length = $("metric").value === "episode_length";
  const traces = shown.flatMap((s) => {
    const key = `${seriesKey(s)} · ${s.agent}`, color = COLORS[agents.indexOf(s.agent) % COLORS.length];
    const x = s.bin.map((_, i) => xMid(s, i, axis)), common = { type: "scatter", legendgroup: key, x };
    const mean = { ...common, y: s.mean, mode: s.bin.length < 30 ? "lines+markers" : "lines", name: key,
      line: { color, width: 2.5 }, meta: { kind: "agent", key, agent: s.agent }, customdata: s.count,
      hovertemplate: `${key}<br>mean %{y:.4~g} of %{customdata} episodes<extra></extra>` };
    return band ? [
      { ...common, y: s.p90, mode: "lines", line: { width: 0, color }, showlegend: false, hoverinfo: "skip",
        name: `${key} p90` },
      { ...common, y: s.p10, mode: "lines", line: { width: 0, color }, fill: "tonexty", fillcolor: rgba(color, 0.15),
        showlegend: false, hoverinfo: "skip", name: `${key} p10–p90` },
      mean] : [mean];
  });
  const by = $("agent-by").value === "agent_group" ? "agent group" : "agent";
  const yTitle = length ? `${by} length` : `${by} return${state.gamma === null ? "" : " (undiscounted)"}`;
  return Plotly.react("agent-curves", traces, {
    margin: { t: 30, r: 20, b: 50, l: 60 }, uirevision: `agents/${axis}`,
    annotations: traces.length ? [] : note("no multi-agent runs shown"),
    xaxis: { title: { text: $("xaxis").selectedOptions[0].text } }, yaxis: { title: { text: yTitle } },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, hovermode: "closest", showlegend: true,
  }, PLOT_CONFIG);
}

// Per-run statistics side by side (/stats by run and env), for the series shown.
function renderCompare() {
  const shown = state.stats.filter(shownKey), table = $("compare");
  const rows = [["episodes", "n_traj", 0], ["return mean", "return_mean"], ["return std", "return_std"],
    ["return min", "return_min"], ["return max", "return_max"], ["length mean", "len_mean", 1]];
  if (state.gamma !== null) rows.push([`discounted return mean (γ=${state.gamma})`, "discounted_return_mean"]);
  const head = document.createElement("tr");
  cell(head, "");
  for (const s of shown) {
    const th = cell(head, seriesKey(s));
    th.style.borderBottom = `3px solid ${seriesColor(seriesKey(s))}`;
  }
  const body = rows.map(([label, key, digits]) => {
    const tr = document.createElement("tr");
    cell(tr, label);
    for (const s of shown) cell(tr, fmt(s[key], digits ?? 3));
    return tr;
  });
  table.querySelector("thead").replaceChildren(head);
  table.querySelector("tbody").replaceChildren(...body);
}

// The binned curves, histograms and per-run stats for the controls as they are; ``sketch`` is called with the
// binned curves as soon as they come.
async function loadBinned(sketch = null) {
  const g = state.gamma, metric = $("metric").value;
  const y = metric === "episode_length" ? "episode_length" : "episode_return";  // discounted with γ
  const curves = api("/curves/binned", { x: $("xaxis").value, y, gamma: g, bins: binCount() });
  const sketched = sketch ? curves.then((b) => { state.binned = b; return sketch(b); }) : null;
  // The first load asks for the rest once the curves are sketched: a service just started then answers the first
  // plot's requests alone (its cores are the browser's too), and computes these while Plotly.js compiles.
  if (sketched) await sketched;
  const [binned, ret_, len, stats, agents] = await Promise.all([
    curves,
    api("/curves/histogram", { y: "episode_return", gamma: g, bins: HIST_BINS, density: true }),
    api("/curves/histogram", { y: "episode_length", bins: HIST_BINS, density: true }),
    api("/stats", { by: "run_id,env_id", gamma: g }),
    // per agent (multi-agent runs only: single-agent episodes have no agent series, and the section stays hidden)
    api("/curves/binned", { x: $("xaxis").value, y, bins: binCount(), by: $("agent-by").value }),
  ]);
  state.binned = binned;
  state.agentCurves = agents;
  state.hists = { ret: ret_, len };
  state.stats = stats;
  await sketched;
}

// The learning curves' sketch (sketch.js) from ``binned``, the curves just fetched, before Plotly.js is loaded.
function sketchPlots(binned) {
  const metric = $("metric").value, axis = $("xaxis").value;
  state.sketch = sketchCurves($("curves"), binned.series.filter(shownKey), {
    colorOf: (b) => seriesColor(seriesKey(b)), band: $("band").value !== "none", time: axis === "wall_time",
    xTitle: $("xaxis").selectedOptions[0].text, yTitle: metric === "episode_length" ? "episode length" : returnLabel(),
  });
  return nextPaint();
}

// --- the page's URL: runs shown, axes and γ, so that a view can be shared and survives a reload -------------

function saveUrl() {
  const url = new URL(window.location.href), p = url.searchParams;
  for (const k of ["run", "x", "y", "gamma", "band", "density", "live", "agents"]) p.delete(k);
  const runs = [...new Set(state.runs.flatMap((r) => r.envs.map((e) => ({ run: r.run_id, key: `${r.run_id} · ${e.env_id}` })))
    .filter((s) => !state.hidden.has(s.key)).map((s) => s.run))];
  if (state.hidden.size) for (const r of runs) p.append("run", r);
  if ($("xaxis").value !== "env_steps") p.set("x", $("xaxis").value);
  if ($("metric").value !== "episode_return") p.set("y", $("metric").value);
  if ($("gamma").value.trim() !== "") p.set("gamma", $("gamma").value.trim());
  if ($("band").value !== "p10") p.set("band", $("band").value);
  if ($("density").checked) p.set("density", "1");
  if (!$("live").checked) p.set("live", "0");
  if ($("agent-by").value !== "agent_id") p.set("agents", "group");
  window.history.replaceState(null, "", url);
}

function restoreUrl() {
  const p = new URLSearchParams(window.location.search);
  const set = (id, value) => {
    if (value !== null && [...$(id).options].some((o) => o.value === value)) $(id).value = value;
  };
  set("xaxis", p.get("x"));
  set("metric", p.get("y"));
  set("band", p.get("band"));
  if (p.get("gamma") !== null) $("gamma").value = p.get("gamma");
  $("density").checked = p.get("density") === "1";
  $("live").checked = p.get("live") !== "0";  // ?live=0: no event stream, no polling
  if (p.get("agents") === "group") $("agent-by").value = "agent_group";
  state.urlRuns = p.getAll("run");
}

// Runs named in the URL: every other series hidden (once, when the runs are first known).
function applyUrlRuns() {
  if (!state.urlRuns || !state.urlRuns.length) return;
  const wanted = new Set(state.urlRuns);
  for (const r of state.runs) for (const e of r.envs) if (!wanted.has(r.run_id)) state.hidden.add(`${r.run_id} · ${e.env_id}`);
  state.urlRuns = null;
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

// Complete episodes first (an unfinished one, cut by a rollout's end or still running, is a fragment), then the
// column chosen: the latest to end by default.
async function loadEpisodes() {
  const t = state.table, g = state.gamma, token = ++t.token;
  const payload = await api("/episodes", { ...episodeFilters(), order_by: `-complete,${t.sort}`, limit: t.size,
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
    cell(tr, fmt(ep.episode_length, 0));
    if (ep.complete) {
      for (const c of [ep.terminated ? "✓" : "", ep.truncated ? "✓" : ""]) cell(tr, c);
    } else {  // neither flag: its last stored step did not end it
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.textContent = "unfinished";
      cell(tr, badge).colSpan = 2;
      tr.classList.add("unfinished");
      tr.title = "unfinished: its last stored step is neither terminated nor truncated (statistics leave it out)";
    }
    for (const c of [fmt(ep.policy_version, 0), when(ep.ended_at)]) cell(tr, c);
    tr.addEventListener("click", () => showEpisode(ep.episode_id, ep.env_id).catch(fail));
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

// The columns and picture leaves of one environment (/schema?env_id=, JSON), asked once per environment.
function envSchema(env) {
  if (!state.schemas.has(env)) {
    const asked = api("/schema", { env_id: env });
    asked.catch(() => state.schemas.delete(env));
    state.schemas.set(env, asked);
  }
  return state.schemas.get(env);
}

async function episodeEnv(id) {
  const page = await api("/episodes", { episode_id: id, limit: 1 });
  if (!page.items.length) throw new Error(`episode ${id}: no such episode in the store`);
  return page.items[0].env_id;
}

// Open one episode: its steps and return-to-go (for the chosen γ, 0.99 when none) from the API, then its plots;
// an environment whose observations are pictures gets the frame player instead of the observation plot, and
// its steps are asked for without obs/next_obs (the pictures come one at a time, as PNGs drawn by the service).
// A multi-agent episode (rows with an agent_id) shows one agent at a time: `agent`, else the one shown before in
// this episode, else its first; the agent selector lists them all.
async function showEpisode(id, env, agent) {
  const t0 = performance.now(), token = ++state.episodeToken;
  const g = state.gamma === null ? 0.99 : state.gamma;
  env = env || await episodeEnv(id);
  const images = (await envSchema(env)).images || [];
  const columns = images.length
    ? ["run_id", ...(await envSchema(env)).columns.map((c) => c.name)
      .filter((n) => !["obs", "next_obs", "run_id", "env_id", "step"].includes(n))] : [];
  const [stepsPage, rtgRows] = await Promise.all([
    api(`/episodes/${encodeURIComponent(id)}/steps`, { columns: columns.join(",") }),
    api("/returns", { per: "step", episode_id: id, gamma: g, limit: 100000 }),
  ]);
  if (token !== state.episodeToken) return;  // a later click won
  const agents = [...new Set(stepsPage.steps.map((r) => r.agent_id).filter((a) => a !== null && a !== undefined))]
    .sort();
  const before = state.episode && state.episode.id === id ? state.episode.agent : null;
  const chosen = agents.length ? [agent, before].find((a) => agents.includes(a)) ?? agents[0] : null;
  const mine = (rows) => (chosen === null ? rows : rows.filter((r) => r.agent_id === chosen));
  showAgents(agents, chosen);
  const Plotly = await plotlyReady(), steps = mine(stepsPage.steps), last = steps[steps.length - 1];
  const rtg = mine(rtgRows);
  const end = last.terminated ? "terminated" : last.truncated ? "truncated" : "unfinished";
  const total = steps.reduce((acc, r) => acc + r.reward, 0);
  state.episode = { id, env, steps: steps.length, gamma: g, complete: end !== "unfinished", images: images.length,
    agent: chosen, agents };
  $("episode").hidden = false;
  const who = chosen === null ? "" : `agent ${chosen} (of ${agents.length}) · `;
  $("episode-title").textContent = `Episode ${id} · ${last.run_id ?? ""} · ${env} · ${who}`
    + `${fmt(steps.length, 0)} steps · return ${fmt(total, 3)} · ${end}`;
  for (const tr of $("episodes").querySelectorAll("tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.episodeId === id);
  }
  $("ep-obs").hidden = images.length > 0;
  await Promise.all([rewardPlot(Plotly, steps, rtg, g), extrasPlot(Plotly, steps),
    images.length ? Promise.resolve() : observationPlot(Plotly, steps)]);
  showFrames(id, steps.length, images);
  await nextPaint();
  state.timings.episode_ms = performance.now() - t0;
  $("episode").scrollIntoView({ block: "start" });
}

// The agent selector of a multi-agent episode (hidden for single-agent ones).
function showAgents(agents, chosen) {
  const select = $("ep-agent");
  $("ep-agent-label").hidden = agents.length === 0;
  select.length = 0;
  for (const a of agents) select.add(new Option(a, a));
  if (chosen !== null) select.value = chosen;
}

// --- the frame player: one step's picture at a time, beside the reward curve ---------------------------------

function showFrames(id, n, images) {
  const kept = state.frame && state.frame.id === id ? state.frame : null;  // a growing episode keeps its place
  state.frame = null;
  $("ep-frames").hidden = !images.length;
  if (!images.length) { $("frame-img").removeAttribute("src"); return; }
  const select = $("frame-leaf"), chosen = kept ? kept.leaf : images[0].leaf;
  select.length = 0;
  for (const im of images) {
    const size = `${im.height}×${im.width}${im.channels > 1 ? `×${im.channels}` : ""}`;
    select.add(new Option(`${im.leaf} (${size}${im.stack ? `, newest of ${im.stack}` : ""})`, im.leaf));
  }
  select.value = images.some((im) => im.leaf === chosen) ? chosen : images[0].leaf;
  $("frame-leaf-label").hidden = images.length < 2;
  const slider = $("frame-step");
  slider.max = String(n - 1);
  slider.value = String(kept ? Math.min(kept.step, n - 1) : 0);
  state.frame = { id, steps: n, step: 0, leaf: select.value, requests: 0, loaded: 0, shown: null,
    leaves: images.map((im) => im.leaf) };
  drawFrame();
}

// Ask for the picture of the slider's step (the browser drops a request the next one replaces) and mark the step
// on the reward curve.
function drawFrame() {
  const f = state.frame;
  if (!f) return;
  f.step = Number($("frame-step").value);
  f.leaf = $("frame-leaf").value;
  $("frame-label").textContent = `${fmt(f.step, 0)} of ${fmt(f.steps - 1, 0)}`;
  const size = Math.min(FRAME_MAX_PX, Math.round(FRAME_BOX_PX * (window.devicePixelRatio || 1)));
  const url = apiUrl(`/episodes/${encodeURIComponent(f.id)}/frames`, { step: f.step, size, leaf: f.leaf });
  const wanted = { step: f.step, leaf: f.leaf }, img = $("frame-img");
  img.onload = () => { if (state.frame === f) { f.loaded += 1; f.shown = wanted; } };
  img.onerror = () => { if (state.frame === f) fail(new Error(`GET ${url.pathname}${url.search}: no picture`)); };
  f.requests += 1;
  img.src = url.toString();
  if (window.Plotly && $("ep-reward").data) {
    window.Plotly.relayout("ep-reward", { shapes: [{ type: "line", xref: "x", yref: "paper", x0: f.step,
      x1: f.step, y0: 0, y1: 1, line: { color: "#6b7385", width: 1, dash: "dot" } }] });
  }
}

function closeEpisode() {
  state.episode = null;
  state.frame = null;
  state.episodeToken += 1;
  $("episode").hidden = true;
  for (const tr of $("episodes").querySelectorAll("tbody tr.selected")) tr.classList.remove("selected");
}

// --- loading and live updates -------------------------------------------------------------------------------

async function load() {
  const t0 = performance.now(), g = gamma(), first = state.loads === 0;
  const ready = await api("/ready", {});  // the version first: data read later is never older
  state.gamma = g;
  // On the first load the tables go on screen as soon as they can; the per-episode markers follow, small stores only.
  const runs = api("/runs", { last: LAST_N, gamma: g }).then((r) => { state.runs = r; applyUrlRuns(); if (first) renderRuns(); return r; });
  // On the first load, the learning curves are sketched as soon as they come (the first plot on screen), and only
  // then is Plotly.js compiled and run (it holds the page for half a second): after the sketch, or after
  // PLOTLY_AFTER_MS when the service is slow to answer, so that its compiling overlaps the wait.
  let done = null;
  const sketched = new Promise((resolve) => { done = resolve; });
  const binned = loadBinned(first ? async (b) => {
    await runs;  // the series' colours: their order in the runs table
    if (!window.Plotly) { await sketchPlots(b); performance.mark("trajstore-first-plot"); }
    done(); } : null);
  if (first) {
    Promise.race([sketched, new Promise((resolve) => setTimeout(resolve, PLOTLY_AFTER_MS))])
      .then(() => plotlyReady()).catch(() => {});
  }
  let complete = 0;
  const curves = runs.then((r) => {
    complete = r.reduce((acc, run) => acc + run.envs.reduce((m, e) => m + e.complete_episodes, 0), 0);
    return complete <= POINTS_LIMIT ? api("/curves", { gamma: g }).then((c) => c.series) : [];
  });
  // (the episodes table too, on the first load: after the sketch, or once the curves failed)
  const table = first ? Promise.race([sketched, binned.catch(() => {})]).then(() => loadEpisodes()) : loadEpisodes();
  const tables = Promise.all([runs, table]).then(async () => {
    if (first) { await nextPaint(); performance.mark("trajstore-tables"); }
  });
  const [c] = await Promise.all([curves, binned, runs]);  // the plots do not wait for the episodes table
  state.curves = c;
  renderRuns();
  await renderPlots();
  state.points = complete;
  await nextPaint();
  if (!state.loads) {
    if (!performance.getEntriesByName("trajstore-first-plot").length) performance.mark("trajstore-first-plot");
    performance.mark("trajstore-plots");
  }
  await Promise.all([table, tables]);
  state.version = ready.version;
  if (state.episode && !state.episode.complete) {  // it may have grown
    await showEpisode(state.episode.id, state.episode.env, state.episode.agent);
  }
  state.loads += 1;
  state.timings.load_ms = performance.now() - t0;
  const series = state.binned.series.length;
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

// Live updates, while "live" is checked: commits are pushed (/events, Server-Sent Events), each one that lands
// redraws the page (folded into one reload while one runs); without EventSource, the page polls /ready instead.
// Unchecked (or ?live=0 in the URL), nothing stays open and nothing is polled: the page is still, so a headless
// screenshot with a virtual-time budget finishes.
function listen() {
  if (!$("live").checked || state.source || state.polling) return;
  if (typeof EventSource === "undefined") { state.polling = setTimeout(poll, POLL_MS); return; }
  const source = new EventSource("/events");
  source.addEventListener("commit", () => {
    state.events += 1;
    refresh().catch(fail);
  });
  state.source = source;
}

function stopListening() {
  if (state.source) { state.source.close(); state.source = null; }  // the server drops the subscriber at once
  if (state.polling) { clearTimeout(state.polling); state.polling = null; }
}

async function poll() {
  state.polling = null;
  try {
    if (!document.hidden && !state.refreshing) {
      const ready = await api("/ready", {});
      if (ready.version !== state.version) await refresh();
    }
  } catch (err) { fail(err); }
  if ($("live").checked && !state.polling) {
    state.polling = setTimeout(poll, Math.max(POLL_MS, 2 * (state.timings.load_ms || 0)));
  }
}

function wire() {
  $("live").addEventListener("change", () => {
    saveUrl();
    if ($("live").checked) { listen(); refresh().catch(fail); } else stopListening();  // catch up on commits missed
  });
  window.addEventListener("pagehide", stopListening);
  $("band").addEventListener("change", () => { saveUrl(); renderPlots().catch(fail); });
  $("density").addEventListener("change", () => { saveUrl(); renderPlots().catch(fail); });
  $("agent-by").addEventListener("change", () => { saveUrl(); loadBinned().then(renderPlots).catch(fail); });
  $("ep-agent").addEventListener("change", () => {
    if (state.episode) showEpisode(state.episode.id, state.episode.env, $("ep-agent").value).catch(fail);
  });
  for (const id of ["metric", "xaxis"]) {
    $(id).addEventListener("change", () => { saveUrl(); loadBinned().then(renderPlots).catch(fail); });
  }
  $("gamma").addEventListener("change", () => {
    saveUrl();
    refresh().then(() => state.episode && showEpisode(state.episode.id, state.episode.env, state.episode.agent))
      .catch(fail);
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
  $("frame-step").addEventListener("input", drawFrame);
  $("frame-leaf").addEventListener("change", drawFrame);
}

restoreUrl();
wire();
listen();
refresh()
  .then(() => { state.ready = true; performance.mark("trajstore-ready"); })
  .catch(fail);
