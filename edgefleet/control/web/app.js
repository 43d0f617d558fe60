// edgefleet dashboard: polls the control plane's JSON API and draws the fleet, plots (inline SVG) and rollouts.
// No libraries, no network beyond this origin.
"use strict";

const COLORS = { p50: "#1f77b4", p95: "#d62728", golden: "#2ca02c" };
const STATE_COLORS = {
  passed: "#2ca02c", installed: "#98df8a", deploying: "#1f77b4", baseline: "#aec7e8", waiting: "#e5e7eb",
  failed: "#d62728", "timed-out": "#ff7f0e", "rolling-back": "#ff9896", "rolled-back": "#9467bd",
  "rollback-timed-out": "#8c564b", kept: "#bcbd22",
};
const MAX_CHARTS = 12;
const SVG = "http://www.w3.org/2000/svg";

const state = { devices: [], selected: new Set(), chosenByUser: false, filter: "" };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fmt(value, digits = 3) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 90) return `${Math.max(0, Math.round(seconds))} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 3600)} h`;
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// --- fleet table
function renderFleet(data) {
  state.devices = data.devices;
  const online = data.devices.filter((d) => d.online).length;
  const c = data.counters || {};
  const engine = data.engine ? (data.engine.alive ? `engine: ${data.engine.holder}` : "engine: not running") : "engine: never ran";
  document.getElementById("summary").textContent =
    `${online}/${data.devices.length} devices online · ${c["ingest.telemetry"] || 0} reports stored · ` +
    `${c["ingest.duplicates"] || 0} duplicates · ${(c["ingest.malformed"] || 0) + (c["ingest.unknown_device"] || 0) +
    (c["ingest.mismatched"] || 0)} refused · ${engine}`;
  if (!state.chosenByUser) {
    state.selected = new Set(data.devices.slice(0, 6).map((d) => d.device_id));
  }
  const tbody = document.querySelector("#fleet tbody");
  const rows = [];
  const needle = state.filter.toLowerCase();
  for (const d of data.devices) {
    const text = `${d.device_id} ${d.profile} ${d.bundle} ${d.state} ${Object.entries(d.labels).join(" ")}`.toLowerCase();
    if (needle && !text.includes(needle)) continue;
    const labels = Object.entries(d.labels).map(([k, v]) => `${k}=${v}`).concat(d.groups.map((g) => `group=${g}`));
    const tr = el("tr", { "data-device": d.device_id, class: state.selected.has(d.device_id) ? "selected" : "" },
      el("td", { text: d.device_id }),
      el("td", {}, el("span", { class: `dot ${d.online ? "on" : "off"}`, title: d.online ? "online" : "offline" })),
      el("td", { text: d.state }), el("td", { text: d.profile || "-" }), el("td", { text: d.bundle || "-" }),
      el("td", { text: d.verified ? "yes" : "no" }),
      el("td", { class: "num", text: fmt(d.p50_ms) }), el("td", { class: "num", text: fmt(d.p95_ms) }),
      el("td", { class: "num", text: fmt(d.golden_agreement, 2) }), el("td", { class: "num", text: fmt(d.cpu_percent, 0) }),
      el("td", { class: "num", text: fmt(d.rss_mb, 0) }), el("td", { text: labels.join(", ") }),
      el("td", { text: ago(d.telemetry_age_s ?? d.status_age_s) }));
    tr.addEventListener("click", () => toggle(d.device_id));
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
}

function toggle(deviceId) {
  if (!state.chosenByUser) { state.selected = new Set(); state.chosenByUser = true; }
  if (state.selected.has(deviceId)) state.selected.delete(deviceId);
  else if (state.selected.size < MAX_CHARTS) state.selected.add(deviceId);
  for (const tr of document.querySelectorAll("#fleet tbody tr")) {
    tr.classList.toggle("selected", state.selected.has(tr.dataset.device));
  }
  refreshCharts();
}

// --- plots
// A line chart: one path per series, gaps where a value is missing; y from 0 (or yMin) to the data's max.
function lineChart(points, series, opts) {
  const W = 400, H = 120, L = 44, R = 8, T = 8, B = 18;
  const svg = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", "data-kind": opts.kind });
  const xs = points.map((p) => p.ts);
  // The x axis starts at the first point when the history is shorter than the window (a new device).
  const x0 = points.length ? Math.max(opts.since, Math.min(points[0].ts, opts.until - 10)) : opts.since;
  const x1 = opts.until;
  let yMax = opts.yMax ?? 0;
  let yMin = opts.yMin ?? 0;
  for (const s of series) for (const p of points) if (p[s.key] !== null && p[s.key] !== undefined) yMax = Math.max(yMax, p[s.key]);
  if (opts.yMax === undefined) yMax = yMax > 0 ? yMax * 1.1 : 1;
  if (yMax <= yMin) yMax = yMin + 1;
  const X = (t) => L + ((t - x0) / Math.max(1e-9, x1 - x0)) * (W - L - R);
  const Y = (v) => T + (1 - (v - yMin) / (yMax - yMin)) * (H - T - B);
  svg.append(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.append(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const label = (x, y, text, anchor = "end") => {
    const t = svgEl("text", { x, y, "text-anchor": anchor }); t.textContent = text; svg.append(t);
  };
  label(L - 4, T + 8, `${opts.format(yMax)}`);
  label(L - 4, H - B, `${opts.format(yMin)}`);
  label(L, H - 4, new Date(x0 * 1000).toLocaleTimeString(), "start");
  label(W - R, H - 4, new Date(x1 * 1000).toLocaleTimeString());
  for (const s of series) {
    let d = "";
    let pen = false;
    points.forEach((p, i) => {
      const v = p[s.key];
      if (v === null || v === undefined) { pen = false; return; }
      const cmd = pen ? "L" : "M";
      d += `${cmd}${X(xs[i]).toFixed(1)},${Y(v).toFixed(1)} `;
      pen = true;
    });
    // A lone point still shows: a short horizontal stroke.
    if (d && !d.includes("L")) d += `l4,0`;
    if (d) svg.append(svgEl("path", { class: "line", d: d.trim(), stroke: s.color, "data-series": s.key }));
  }
  return svg;
}

async function refreshCharts() {
  const container = document.getElementById("charts");
  const windowS = Number(document.getElementById("window").value);
  const ids = [...state.selected].slice(0, MAX_CHARTS);
  const cards = await Promise.all(ids.map(async (id) => {
    try {
      const data = await getJSON(`/api/devices/${encodeURIComponent(id)}/series?window=${windowS}&points=240`);
      const card = el("div", { class: "card", "data-device": id });
      const last = data.points.length ? data.points[data.points.length - 1] : null;
      card.append(el("h3", {}, el("span", { text: id }), el("span", { class: "muted", text: last && last.bundle ? last.bundle : "" })));
      const opts = { since: data.since, until: data.until };
      card.append(lineChart(data.points, [{ key: "p50_ms", color: COLORS.p50 }, { key: "p95_ms", color: COLORS.p95 }],
        { ...opts, kind: "latency", format: (v) => `${v.toFixed(2)} ms` }));
      card.append(lineChart(data.points, [{ key: "golden_agreement", color: COLORS.golden }],
        { ...opts, kind: "golden", yMin: 0, yMax: 1.05, format: (v) => v.toFixed(2) }));
      return card;
    } catch (err) {
      return el("div", { class: "card", text: `${id}: ${err.message}` });
    }
  }));
  container.replaceChildren(...cards);
}

// --- rollouts
function renderRollouts(data) {
  const container = document.getElementById("rollouts");
  if (!data.rollouts.length) { container.replaceChildren(el("p", { class: "muted", text: "none yet" })); return; }
  container.replaceChildren(...data.rollouts.map((r) => {
    const box = el("div", { class: "rollout", "data-rollout": r.id, "data-state": r.state });
    box.append(el("div", { class: "head" },
      el("strong", { text: r.id }), el("span", { class: `badge ${r.state}`, text: r.state }),
      el("span", { class: "muted", text: `group ${r.group} · ${r.bundles.join(", ")}` })));
    const waves = el("div", { class: "waves" });
    for (const w of r.waves) {
      const bar = el("div", { class: "bar", title: JSON.stringify(w.counts) });
      for (const [s, n] of Object.entries(w.counts)) {
        bar.append(el("span", { style: `width:${(100 * n) / w.devices}%;background:${STATE_COLORS[s] || "#999"}`, title: `${s}: ${n}` }));
      }
      const name = w.index === 0 ? "canary" : `wave ${w.index}`;
      waves.append(el("div", { class: "wave", "data-wave": w.index, "data-state": w.state },
        el("span", { text: `${name} (${w.devices})` }), bar,
        el("span", { class: "muted", text: w.verdict || w.state })));
    }
    box.append(waves);
    if (r.outcome) box.append(el("div", { text: r.outcome }));
    if (r.failures.length) {
      box.append(el("div", { class: "failures", text: r.failures.slice(0, 5).map((f) => `${f.device_id} ${f.state}: ${f.reason}`).join("\n") }));
    }
    const lines = r.log.map((e) => `${new Date(e.ts * 1000).toLocaleTimeString()} ${e.message}`).reverse();
    box.append(el("div", { class: "log", text: lines.join("\n") }));
    return box;
  }));
}

async function refresh() {
  try {
    const [fleet, rollouts] = await Promise.all([getJSON("/api/fleet"), getJSON("/api/rollouts")]);
    renderFleet(fleet);
    renderRollouts(rollouts);
    document.body.dataset.loaded = "true";
  } catch (err) {
    document.getElementById("summary").textContent = `cannot reach the control plane: ${err.message}`;
  }
}

document.getElementById("filter").addEventListener("input", (e) => { state.filter = e.target.value; refresh(); });
document.getElementById("window").addEventListener("change", refreshCharts);

(async function main() {
  await refresh();
  await refreshCharts();
  document.body.dataset.charts = "true";
  setInterval(refresh, 2000);
  setInterval(refreshCharts, 5000);
})();
