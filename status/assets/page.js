// The status page: polls the JSON API every second and redraws. Plain
// browser JavaScript, no build step; charts by uPlot (window.uPlot).
"use strict";

const POLL_MS = 1000;
const RATE_WINDOW_S = 10;
let selected = decodeURIComponent(location.hash.slice(1));
let charts = null; // {id, plots: [{plot, series}]}

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined) ? "–"
  : (typeof n === "number" ? n.toLocaleString("en-US", {maximumFractionDigits: 1}) : String(n));
const seconds = (ms) => (ms === null || ms === undefined) ? "–"
  : (ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`);
const bytes = (n) => n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB`
  : n < 1073741824 ? `${(n / 1048576).toFixed(1)} MiB` : `${(n / 1073741824).toFixed(2)} GiB`;

function cell(tr, text, num) {
  const td = document.createElement("td");
  td.textContent = text;
  if (num) td.className = "num";
  tr.appendChild(td);
  return td;
}

async function get(path) {
  const answer = await fetch(path, {cache: "no-store"});
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

function drawList(queries) {
  const body = $("queries").tBodies[0];
  body.replaceChildren();
  $("none").hidden = queries.length > 0;
  if (!selected && queries.length) selected = queries[0].id;
  for (const q of queries) {
    const tr = document.createElement("tr");
    tr.dataset.id = q.id;
    if (q.id === selected) tr.className = "selected";
    cell(tr, q.name);
    const state = cell(tr, "");
    const badge = document.createElement("span");
    badge.className = `state ${q.state}`;
    badge.textContent = q.state;
    state.appendChild(badge);
    cell(tr, fmt(q.epoch), true);
    cell(tr, `${q.tasks_here} / ${q.tasks_total}`, true);
    cell(tr, fmt(q.input_rows_per_second), true);
    cell(tr, fmt(q.lag_records), true);
    cell(tr, seconds(q.watermark_delay_ms), true);
    tr.onclick = () => { selected = q.id; location.hash = encodeURIComponent(q.id); refresh(); };
    body.appendChild(tr);
  }
  if (queries.length) $("process").textContent = `${queries[0].process.host} · pid ${queries[0].process.pid}`;
}

// Rows per second over the last RATE_WINDOW_S seconds of progress.
function recentRate(progress, field) {
  if (!progress.length) return null;
  const end = Date.parse(progress[progress.length - 1].timestamp);
  const recent = progress.filter((p) => Date.parse(p.timestamp) > end - RATE_WINDOW_S * 1000);
  const span = Math.max(1, (end - Date.parse(recent[0].timestamp)) / 1000);
  return recent.reduce((sum, p) => sum + p[field], 0) / span;
}

// The plan as EXPLAIN prints it, drawn as a tree of operators (indentation
// is nesting), its sources' and sink's edges labelled with rows/s.
function drawPlan(q, progress) {
  const plan = $("plan");
  plan.replaceChildren();
  const inRate = recentRate(progress, "input_rows");
  const outRate = recentRate(progress, "output_rows");
  const totalIn = q.sources.reduce((s, x) => s + x.input_rows, 0);
  const sink = document.createElement("div");
  sink.className = "edge";
  sink.textContent = `→ ${q.last_commit ? q.last_commit.sink : "sink"}: ${fmt(outRate)} rows/s`;
  plan.appendChild(sink);
  for (const line of q.plan.split("\n")) {
    if (!line.trim()) continue;
    const depth = line.length - line.trimStart().length;
    const text = line.trim();
    const node = document.createElement("div");
    if (/^(--|tasks|chain|statement|sub-topolog|repartition step|channel)/i.test(text)) {
      node.className = "stage";
      node.textContent = text;
    } else {
      node.className = "node";
      node.textContent = (depth ? " ".repeat(depth - 2) + "└─ " : "") + text;
      const scan = /TableScan: ([^\s]+)/.exec(text);
      if (scan) {
        const source = q.sources.find((s) => s.description.split(" ")[0] === scan[1]);
        const edge = document.createElement("span");
        edge.className = "edge";
        // Only scans of a source: a scan of an operator's own output
        // (a stateless segment after it) has no edge from outside.
        if (source) {
          const share = totalIn ? source.input_rows / totalIn : null;
          edge.textContent = `  ← ${source.description}: ${share === null || inRate === null ? "–" : fmt(inRate * share)} rows/s`;
          node.appendChild(edge);
        }
      }
    }
    plan.appendChild(node);
  }
}

function drawDetail(q, progress) {
  $("detail").hidden = false;
  $("title").textContent = `${q.name} (${q.id})`;
  $("state").className = `state ${q.state}`;
  $("state").textContent = q.state;
  $("message").textContent = q.message;
  $("error").hidden = !q.error;
  $("error").textContent = q.error ? `error: ${q.error}` : "";
  $("epoch").textContent = fmt(q.epoch);
  $("commit").textContent = q.last_commit
    ? `epoch ${q.last_commit.epoch}${q.last_commit.task === null ? "" : ` of task ${q.last_commit.task}`}, planned ${q.last_commit.timestamp}, ${q.last_commit.output_rows} rows to ${q.last_commit.sink} in its transaction`
    : "none yet";
  $("lag-total").textContent = fmt(q.lag_records);
  $("watermark").textContent = q.watermark ? `${q.watermark} (${seconds(q.watermark_delay_ms)} behind)` : "none";
  $("late").textContent = fmt(q.late_rows);
  $("state-size").textContent = `${fmt(q.state_rows)} rows · ${bytes(q.state_bytes)}`;
  $("statement").textContent = q.statement;
  drawPlan(q, progress);

  const lagBody = $("lag-table").tBodies[0];
  lagBody.replaceChildren();
  for (const s of q.sources) {
    for (const [partition, lag] of Object.entries(s.lag)) {
      const tr = document.createElement("tr");
      cell(tr, s.description);
      cell(tr, partition, true);
      cell(tr, fmt(lag), true).className = "num lag";
      lagBody.appendChild(tr);
    }
  }
  const taskBody = $("tasks").tBodies[0];
  taskBody.replaceChildren();
  for (const t of q.tasks) {
    const tr = document.createElement("tr");
    tr.dataset.task = t.task === null ? "" : t.task;
    cell(tr, t.task === null ? "(one)" : t.task, true);
    cell(tr, t.process ? `${t.owner} (${t.process.host}, pid ${t.process.pid})`
      : t.owned_by ? `${t.owner}: ${t.owned_by}` : t.owner);
    cell(tr, t.state);
    cell(tr, fmt(t.epoch), true);
    cell(tr, fmt(t.lag_records), true);
    cell(tr, fmt(t.input_rows_per_second), true);
    cell(tr, seconds(t.watermark_delay_ms), true);
    cell(tr, t.error ? `${t.message}` : t.message);
    taskBody.appendChild(tr);
  }
  drawCharts(q.id, progress);
}

// Per epoch committed, the query's figures then: a divided query's are the
// sum of each task's latest (durations: the epoch's own).
function series(progress) {
  const latest = new Map();
  const cols = {x: [], input: [], processed: [], plan: [], read: [], compute: [], state: [],
    commit: [], state_rows: [], state_bytes: [], lag: []};
  let lastX = -Infinity;
  for (const p of progress) {
    latest.set(p.task === undefined ? null : p.task, p);
    const all = [...latest.values()];
    const sum = (f) => all.reduce((s, r) => s + (f(r) || 0), 0);
    let x = Date.parse(p.timestamp) / 1000;
    if (x <= lastX) x = lastX + 0.001;
    lastX = x;
    cols.x.push(x);
    cols.input.push(sum((r) => r.input_rows_per_second));
    cols.processed.push(sum((r) => r.processed_rows_per_second));
    for (const phase of ["plan", "read", "compute", "state", "commit"]) cols[phase].push(p.duration_ms[phase]);
    cols.state_rows.push(sum((r) => r.state_rows));
    cols.state_bytes.push(sum((r) => r.state_bytes));
    cols.lag.push(sum((r) => r.lag_records));
  }
  return cols;
}

const CHARTS = [
  {title: "rows/s", series: [["input", "input rows/s", "#2b6cb0"], ["processed", "processed rows/s", "#38a169"]]},
  {title: "epoch duration by phase (ms)", series: [["plan", "plan", "#805ad5"], ["read", "read", "#2b6cb0"],
    ["compute", "compute", "#38a169"], ["state", "state", "#d69e2e"], ["commit", "commit", "#e53e3e"]]},
  {title: "state rows", series: [["state_rows", "state rows", "#2c7a7b"]]},
  {title: "state bytes", series: [["state_bytes", "state bytes", "#975a16"]]},
  {title: "lag (records)", series: [["lag", "lag", "#c53030"]]},
];

function drawCharts(id, progress) {
  const cols = series(progress);
  const box = $("charts");
  const width = Math.max(420, Math.min(640, box.clientWidth - 20));
  if (!charts || charts.id !== id) {
    box.replaceChildren();
    charts = {id, plots: CHARTS.map((c) => {
      const div = document.createElement("div");
      div.className = "chart";
      const h = document.createElement("h4");
      h.textContent = c.title;
      div.appendChild(h);
      box.appendChild(div);
      const opts = {width, height: 200, series: [{}].concat(c.series.map(([, label, stroke]) => ({label, stroke, width: 1.5}))),
        axes: [{}, {size: 90}], scales: {x: {time: true}}};
      return {plot: new uPlot(opts, [cols.x].concat(c.series.map(([key]) => cols[key])), div), keys: c.series.map(([key]) => key)};
    })};
  } else {
    for (const {plot, keys} of charts.plots) plot.setData([cols.x].concat(keys.map((k) => cols[k])));
  }
  box.dataset.epochs = String(cols.x.length);
}

async function refresh() {
  try {
    const queries = await get("api/queries");
    drawList(queries);
    if (selected && queries.some((q) => q.id === selected)) {
      const id = encodeURIComponent(selected);
      const [q, progress] = await Promise.all([get(`api/queries/${id}`), get(`api/queries/${id}/progress`)]);
      drawDetail(q, progress);
    }
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("updated").textContent = `cannot reach the process: ${e.message}`;
  }
}

refresh();
setInterval(refresh, POLL_MS);
