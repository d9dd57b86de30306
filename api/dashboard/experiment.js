// trajstore experiment view: groups of runs (runs sharing a value of their config, e.g. config.algo) compared
// across tasks with rliable's statistics. Every number on this page comes from the public REST API (see
// /openapi.json): /runs (the config keys to group by, the tasks), /compare (the IQM of each group with its stratified
// bootstrap interval: per task with where=, and over all tasks), /curves/groups (learning curves across seeds),
// /compare/scores (the score range of the performance profile), /compare/profile and /compare/improvement.
"use strict";

const CURVE_BINS = 50;            // env-steps bins of the learning curves (/curves/groups?bins=)
const PROFILE_POINTS = 25;        // thresholds of the performance profile, from the lowest score to the highest
const DEFAULTS = { metric: "episode_return", last: 100 };

const state = {
  keys: [], runs: [], tasks: [], groups: [], by: null, metric: DEFAULTS.metric, last: DEFAULTS.last,
  table: null, curves: null, thresholds: [], profile: null, improvement: null, token: 0, improvementToken: 0,
  urlChoice: { x: null, y: null }, loads: 0, improvements: 0, busy: false, ready: false, errors: [],
};
window.trajstoreExperiment = state;  // for the browser tests, and for poking around in the console

// --- talking to the API -------------------------------------------------------------------------------

async function api(path, params = {}) {
  return JSON.parse(await apiText(path, params));
}

const message = (err) => String((err && err.message) || err);
// What the service said, without the request ("GET /compare?…: 422 metric: …" -> "metric: …").
const detailOf = (text) => text.replace(/^GET \S+: \d{3} /, "");

function fail(err) {
  reportError(state, "experiment", err);
}

// A string as an SQL literal: single quotes doubled.
const sqlString = (s) => `'${String(s).replaceAll("'", "''")}'`;

// --- config keys: what runs can be grouped by ------------------------------------------------------------

// Each leaf of a run's config as config.a.b (nested objects flattened with dots; lists are values).
function configLeaves(config, prefix = "config", out = new Map()) {
  for (const [k, v] of Object.entries(config || {})) {
    const name = `${prefix}.${k}`;
    if (v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) configLeaves(v, name, out);
    else out.set(name, JSON.stringify(v));
  }
  return out;
}

// The config keys of the runs, in the order they first appear, and the first one whose value differs between runs.
function configKeys(runs) {
  const leaves = runs.map((r) => configLeaves(r.config));
  const keys = [...new Set(leaves.flatMap((l) => [...l.keys()]))];
  const differs = keys.find((k) => new Set(leaves.map((l) => l.get(k))).size > 1);
  return { keys, default: differs ?? keys[0] ?? null };
}

// --- controls and the page's URL ----------------------------------------------------------------------------

// The controls as they are, or an Error saying what is wrong with one.
function readControls() {
  const metric = $("metric").value.trim() || DEFAULTS.metric;
  $("metric").value = metric;
  const raw = $("last").value.trim(), last = Number(raw);
  $("last").classList.toggle("invalid", !(Number.isInteger(last) && last >= 1));
  if (!(Number.isInteger(last) && last >= 1)) throw new Error(`last: expected a whole number of episodes ≥ 1, got ${raw || "nothing"}`);
  return { by: $("by").value, metric, last };
}

function saveUrl() {
  const url = new URL(window.location.href), p = url.searchParams;
  for (const k of ["by", "metric", "last", "x", "y"]) p.delete(k);
  if (state.by) p.set("by", state.by);
  p.set("metric", state.metric);
  p.set("last", String(state.last));
  if ($("x").value) p.set("x", $("x").value);
  if ($("y").value) p.set("y", $("y").value);
  window.history.replaceState(null, "", url);
}

function restoreUrl() {
  const p = new URLSearchParams(window.location.search);
  if (p.get("metric")) $("metric").value = p.get("metric");
  if (p.get("last")) $("last").value = p.get("last");
  state.urlChoice = { x: p.get("x"), y: p.get("y") };
  return p.get("by");
}

// --- numbers ------------------------------------------------------------------------------------------------

// Decimals showing about three significant digits of the largest magnitude among `values`.
function decimals(values) {
  const top = Math.max(0, ...values.filter((v) => typeof v === "number" && Number.isFinite(v)).map(Math.abs));
  return top > 0 ? Math.min(6, Math.max(0, 2 - Math.floor(Math.log10(top)))) : 2;
}

function fixed(x, digits) { return typeof x === "number" && Number.isFinite(x) ? x.toFixed(digits) : "–"; }

function withInterval(row, digits) {
  return `${fixed(row.value, digits)} [${fixed(row.ci_low, digits)}, ${fixed(row.ci_high, digits)}]`;
}

// --- groups ---------------------------------------------------------------------------------------------------

// A group as the API names it: its value of the by key (a string; null for runs without that key).
const groupOf = (row) => (row[state.by] === null || row[state.by] === undefined ? null : String(row[state.by]));
const groupLabel = (g) => (g === null ? "(none)" : g);
const groupParam = (g) => (g === null ? "None" : g);  // how /compare/improvement names the group of null values

// The groups of `rows` not known yet, added in the order the service gives groups (or, with `sort` false, after
// the known ones: the groups on screen keep their colours).
function addGroups(rows, sort = true) {
  const known = new Set(state.groups);
  for (const row of rows || []) {
    const g = groupOf(row);
    if (!known.has(g)) { known.add(g); state.groups.push(g); }
  }
  if (sort) state.groups.sort((a, b) => (a === null) - (b === null) || (a < b ? -1 : a > b ? 1 : 0));
}

function groupColor(g) {
  const i = state.groups.indexOf(g);
  return COLORS[(i < 0 ? state.groups.length : i) % COLORS.length];
}

// A grey message in the middle of an empty plot.
function note(text) {
  return [{ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
    font: { size: 13, color: "#6b7385" } }];
}

// --- the IQM table: groups × tasks, and all tasks -------------------------------------------------------------

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function renderTable() {
  const { perTask, all } = state.table, table = $("iqm");
  const head = document.createElement("tr");
  for (const text of [state.by, ...state.tasks, "all tasks", "runs"]) {
    const th = document.createElement("th");
    th.textContent = text;
    head.appendChild(th);
  }
  const numbers = [...perTask.flatMap((t) => t.rows || []), ...(all.rows || [])]
    .flatMap((r) => [r.value, r.ci_low, r.ci_high]);
  const digits = decimals(numbers);
  const find = (result, g) => (result.rows || []).find((r) => groupOf(r) === g);
  const body = state.groups.map((g) => {
    const tr = document.createElement("tr");
    tr.dataset.group = groupLabel(g);
    const name = cell(tr, groupLabel(g));
    name.style.borderLeft = `4px solid ${groupColor(g)}`;
    const columns = [...perTask.map((t, i) => [t, state.tasks[i]]), [all, ""]];
    for (const [result, task] of columns) {
      const row = find(result, g);
      const td = cell(tr, row ? withInterval(row, digits) : "—", row ? "" : "missing");
      td.dataset.task = task;
      if (!row) td.title = result.error || "no score of this group here";
    }
    const overall = find(all, g);
    cell(tr, overall ? String(overall.n_runs) : "—");
    return tr;
  });
  if (!body.length) {
    const tr = document.createElement("tr");
    const td = cell(tr, "no group has a score: see the status above", "empty");
    td.colSpan = state.tasks.length + 3;
    body.push(tr);
  }
  table.querySelector("thead").replaceChildren(head);
  table.querySelector("tbody").replaceChildren(...body);
}

// --- learning curves across seeds: one plot per task ---------------------------------------------------------

// A line and its band (two traces: the upper edge, then the lower one filled up to it) per group.
function bandedTraces(groups, x, y, low, high, hover) {
  const bands = [], lines = [];
  for (const [g, rows] of groups) {
    const color = groupColor(g), name = groupLabel(g), xs = rows.map(x);
    const common = { type: "scatter", mode: "lines", legendgroup: name, hoverinfo: "skip", showlegend: false };
    bands.push({ ...common, x: xs, y: rows.map(high), line: { width: 0, color }, name: `${name} upper`,
      meta: { kind: "band", group: name } });
    bands.push({ ...common, x: xs, y: rows.map(low), line: { width: 0, color }, fill: "tonexty",
      fillcolor: rgba(color, 0.18), name: `${name} lower`, meta: { kind: "band", group: name } });
    lines.push({ type: "scatter", mode: rows.length < 30 ? "lines+markers" : "lines", x: xs, y: rows.map(y),
      name, legendgroup: name, line: { color, width: 2.5 }, meta: { kind: "line", group: name },
      hovertemplate: `${name}<br>${hover}<extra></extra>` });
  }
  return [...bands, ...lines];
}

function byGroup(rows) {
  const out = new Map();
  for (const row of rows) {
    const g = groupOf(row);
    if (!out.has(g)) out.set(g, []);
    out.get(g).push(row);
  }
  return out;
}

function plotLayout(xTitle, yTitle, annotations = []) {
  return { margin: { t: 30, r: 20, b: 50, l: 60 }, xaxis: { title: { text: xTitle } },
    yaxis: { title: { text: yTitle } }, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    showlegend: true, hovermode: "closest", annotations };
}

async function renderCurves(Plotly) {
  const box = $("curves-by-task"), { rows, error } = state.curves;
  for (const div of box.querySelectorAll(".plot")) Plotly.purge(div);
  if (error) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = `no learning curves: ${error}`;
    box.replaceChildren(p);
    return;
  }
  const tasks = [...new Set(rows.map((r) => r.task))].sort();
  const blocks = tasks.map((task, i) => {
    const block = document.createElement("div"), title = document.createElement("h3"), div = document.createElement("div");
    title.textContent = task;
    div.id = `curves-${i}`;
    div.className = "plot small";
    div.dataset.task = task;
    block.append(title, div);
    return block;
  });
  box.replaceChildren(...blocks);
  if (!blocks.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = "no complete episodes to draw";
    box.replaceChildren(p);
  }
  await Promise.all(tasks.map((task, i) => {
    const mine = byGroup(rows.filter((r) => r.task === task));
    const traces = bandedTraces(mine, (r) => (r.lo + r.hi) / 2, (r) => r.value, (r) => r.ci_low, (r) => r.ci_high,
      "env steps %{x:.4~g}: IQM %{y:.4~g}");
    return Plotly.react(`curves-${i}`, traces, plotLayout("env steps", `${state.metric} (IQM of runs)`), PLOT_CONFIG);
  }));
}

// --- performance profile ----------------------------------------------------------------------------------------

// PROFILE_POINTS thresholds evenly spaced from the lowest score to the highest (as numpy.linspace).
function thresholds(scores) {
  const values = scores.map((r) => r.score).filter((v) => typeof v === "number" && Number.isFinite(v));
  if (!values.length) return [];
  const lo = Math.min(...values), hi = Math.max(...values), step = (hi - lo) / (PROFILE_POINTS - 1);
  return Array.from({ length: PROFILE_POINTS }, (_, i) => (i === PROFILE_POINTS - 1 ? hi : i * step + lo));
}

async function loadProfile(common) {
  const scores = await api("/compare/scores", common);
  const taus = thresholds(scores);
  if (!taus.length) throw new Error("performance profile: no run has a score");
  const rows = await api("/compare/profile", { ...common, threshold: taus });
  return { thresholds: taus, rows };
}

function renderProfile(Plotly) {
  const { rows, error } = state.profile;
  const traces = error ? [] : bandedTraces(byGroup(rows), (r) => r.threshold, (r) => r.value, (r) => r.ci_low,
    (r) => r.ci_high, "score > %{x:.4~g}: %{y:.3f} of runs");
  return Plotly.react("profile", traces, { ...plotLayout(`score (${state.metric}, last ${state.last})`,
    "fraction of runs above", error ? note(`no performance profile: ${error}`) : []), yaxis: {
    title: { text: "fraction of runs above" }, range: [-0.02, 1.02] } }, PLOT_CONFIG);
}

// --- probability of improvement -----------------------------------------------------------------------------------

function fillGroupSelects() {
  const choose = (id, wanted, fallback) => {
    const select = $(id), kept = wanted ?? select.value;
    select.length = 0;
    for (const g of state.groups) select.add(new Option(groupLabel(g), groupParam(g)));
    const values = state.groups.map(groupParam);
    select.value = values.includes(kept) ? kept : (values[fallback] ?? values[0] ?? "");
  };
  choose("x", state.urlChoice.x, 0);
  choose("y", state.urlChoice.y, 1);
  state.urlChoice = { x: null, y: null };
}

async function loadImprovement(common) {
  const token = ++state.improvementToken, x = $("x").value, y = $("y").value, out = $("improvement");
  out.classList.remove("error");
  if (state.groups.length < 2) {
    state.improvement = null;
    out.textContent = "two groups are needed to compare them";
  } else {
    try {
      const got = await api("/compare/improvement", { ...common, x, y });
      if (token !== state.improvementToken) return;
      state.improvement = got;
      out.textContent = `P(${x} > ${y}) = ${fixed(got.value, 2)} [${fixed(got.ci_low, 2)}, ${fixed(got.ci_high, 2)}]`;
    } catch (err) {
      if (token !== state.improvementToken) return;
      state.improvement = null;
      out.textContent = `P(${x} > ${y}) = —`;
      out.classList.add("error");
      throw err;
    }
  }
  state.improvements += 1;
}

// --- loading -------------------------------------------------------------------------------------------------------

const settled = (promise) => promise.then((rows) => ({ rows }), (err) => ({ rows: null, error: message(err) }));

// Everything for the controls as they are; each part that fails says why in the status (and in `errors`), the
// others are drawn regardless. A later call supersedes one still running.
async function load() {
  const { by, metric, last } = readControls();  // throws, changing nothing, when one is wrong
  const token = ++state.token;
  Object.assign(state, { by, metric, last, busy: true });
  saveUrl();
  setStatus("computing…");
  try {
    const common = { by, metric, last };
    const iqm = { ...common, statistic: "iqm" };
    const all = settled(api("/compare", iqm));
    const perTask = state.tasks.map((t) => settled(api("/compare", { ...iqm, where: `env_id = ${sqlString(t)}` })));
    const curves = settled(api("/curves/groups", { by, metric, bins: CURVE_BINS, aggregate: "iqm" }));
    const profile = loadProfile(common).then((p) => p, (err) => ({ rows: null, thresholds: [], error: message(err) }));
    const table = { all: await all, perTask: await Promise.all(perTask) };
    if (token !== state.token) return;
    state.groups = [];
    addGroups(table.all.rows);
    for (const t of table.perTask) addGroups(t.rows);
    state.table = table;
    renderTable();
    fillGroupSelects();
    saveUrl();
    const problems = [table.all.error];
    const improvement = loadImprovement(common).then(() => null, (err) => message(err));
    const [Plotly, c, p] = await Promise.all([plotlyReady(), curves, profile]);
    if (token !== state.token) return;
    addGroups(c.rows, false);
    addGroups(p.rows, false);
    state.curves = c;
    state.profile = p;
    state.thresholds = p.thresholds;
    await Promise.all([renderCurves(Plotly), renderProfile(Plotly)]);
    problems.push(c.error, p.error, await improvement);
    if (token !== state.token) return;
    const unique = [...new Set(problems.filter(Boolean))];
    for (const text of unique) {
      state.errors.push(text);
      console.error(`trajstore experiment: ${text}`);
    }
    if (unique.length) {  // each part refused for the same reason, as a rule: said once
      setStatus([...new Set(unique.map(detailOf))].join(" · "), true);
      $("status").title = unique.join("\n");
    } else {
      $("status").title = "";
      setStatus(`${state.groups.length} groups by ${by} · ${state.tasks.length} tasks · ${metric}, last ${last} · `
        + `${new Date().toLocaleTimeString("en-GB")}`);
    }
  } finally {
    if (token === state.token) { state.busy = false; state.loads += 1; }
  }
}

async function start() {
  const wanted = restoreUrl();
  state.runs = await api("/runs");
  state.tasks = [...new Set(state.runs.flatMap((r) => r.envs.map((e) => e.env_id)))].sort();
  const { keys, default: first } = configKeys(state.runs);
  state.keys = keys;
  const select = $("by");
  for (const k of keys) select.add(new Option(k, k));
  if (!keys.length) {
    $("iqm").querySelector("tbody").innerHTML = '<tr><td class="empty">No run has a config to group by. Describe '
      + "runs with one (<code>store.writer(…, config={\"algo\": \"ppo\"})</code>, or PATCH /runs/{run_id}).</td></tr>";
    setStatus(`${state.runs.length} runs, none with a config`);
    return;
  }
  select.value = keys.includes(wanted) ? wanted : first;
  await load();
}

function wire() {
  const recompute = () => load().catch(fail);
  $("by").addEventListener("change", recompute);
  $("metric").addEventListener("change", recompute);
  $("last").addEventListener("change", recompute);
  for (const id of ["x", "y"]) {
    $(id).addEventListener("change", () => {
      saveUrl();
      loadImprovement({ by: state.by, metric: state.metric, last: state.last }).catch(fail);
    });
  }
  $("improvement-form").addEventListener("submit", (ev) => ev.preventDefault());
}

wire();
start()
  .then(() => { state.ready = true; })
  .catch(fail);
