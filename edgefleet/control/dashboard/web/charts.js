// Inline SVG line charts: one path per series, gaps where a value is missing. No library.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
// Which metrics are drawn, if the store has them: latency and golden always; field accuracy and drift when reported.
const PLOTS = [
  { kind: "latency", title: "latency (ms)", always: true, format: (v) => `${v.toFixed(2)} ms`,
    series: [["p50_ms", "#1f77b4"], ["p95_ms", "#d62728"], ["p99_ms", "#9467bd"], ["p95_ms_max", "#ff7f0e"]] },
  { kind: "golden", title: "golden agreement", always: true, yMin: 0, yMax: 1.05, format: (v) => v.toFixed(2),
    series: [["golden_agreement", "#2ca02c"], ["golden_score", "#17becf"]] },
  { kind: "field", title: "field accuracy", yMin: 0, yMax: 1.05, format: (v) => v.toFixed(2),
    series: [["field_accuracy", "#8c564b"]] },
  { kind: "drift", title: "drift", format: (v) => v.toFixed(3), seriesFrom: (key) => key.startsWith("drift"),
    series: [] },
];
const DRIFT_COLORS = ["#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function lineChart(points, series, opts) {
  const W = 400, H = 120, L = 44, R = 8, T = 8, B = 18;
  const svg = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", "data-kind": opts.kind });
  const x0 = points.length ? Math.max(opts.since, Math.min(points[0].ts, opts.until - 10)) : opts.since;
  const x1 = opts.until;
  let yMax = opts.yMax ?? 0;
  const yMin = opts.yMin ?? 0;
  for (const [key] of series) for (const p of points) if (p[key] !== null && p[key] !== undefined) yMax = Math.max(yMax, p[key]);
  if (opts.yMax === undefined) yMax = yMax > 0 ? yMax * 1.1 : 1;
  if (yMax <= yMin) yMax = yMin + 1;
  const X = (t) => L + ((t - x0) / Math.max(1e-9, x1 - x0)) * (W - L - R);
  const Y = (v) => T + (1 - (v - yMin) / (yMax - yMin)) * (H - T - B);
  svg.append(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.append(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const label = (x, y, text, anchor = "end") => {
    const t = svgEl("text", { x, y, "text-anchor": anchor }); t.textContent = text; svg.append(t);
  };
  label(L - 4, T + 8, opts.format(yMax));
  label(L - 4, H - B, opts.format(yMin));
  label(L, H - 4, new Date(x0 * 1000).toLocaleTimeString(), "start");
  label(W - R, H - 4, new Date(x1 * 1000).toLocaleTimeString());
  for (const [key, color] of series) {
    let d = "";
    let pen = false;
    for (const p of points) {
      const v = p[key];
      if (v === null || v === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${X(p.ts).toFixed(1)},${Y(v).toFixed(1)} `;
      pen = true;
    }
    if (d && !d.includes("L")) d += "l4,0"; // a lone point still shows
    if (d) svg.append(svgEl("path", { class: "line", d: d.trim(), stroke: color, "data-series": key }));
  }
  return svg;
}

// A card of plots for one device or group: every PLOTS entry the data has values for.
function plotCard(title, subtitle, data, attrs) {
  const card = el("div", { class: "card", ...attrs });
  card.append(el("h3", {}, el("span", { text: title }), el("span", { class: "muted", text: subtitle || "" })));
  const keys = new Set(data.points.flatMap((p) => Object.keys(p).filter((k) => p[k] !== null && p[k] !== undefined)));
  for (const plot of PLOTS) {
    let series = plot.series;
    if (plot.seriesFrom) series = [...keys].filter(plot.seriesFrom).sort().map((k, i) => [k, DRIFT_COLORS[i % DRIFT_COLORS.length]]);
    const present = series.filter(([k]) => keys.has(k));
    if (!plot.always && !present.length) continue;
    card.append(el("div", { class: "plot-title muted", text: `${plot.title}: ${present.map(([k]) => k).join(", ") || "no data"}` }));
    card.append(lineChart(data.points, plot.always ? series : present, { ...plot, since: data.since, until: data.until }));
  }
  return card;
}

// A rollout's timeline: one bar per wave from its start to its end (or now), coloured by its state.
function timeline(r, now) {
  const W = 600, H = 16 + 14 * r.waves.length, L = 70, R = 8;
  const t0 = r.created_at, t1 = Math.max(r.finished_at || now, t0 + 1);
  const X = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const svg = svgEl("svg", { class: "timeline", viewBox: `0 0 ${W} ${H}`, "data-rollout": r.id });
  r.waves.forEach((w, i) => {
    const y = 4 + i * 14;
    const t = svgEl("text", { x: L - 4, y: y + 9, "text-anchor": "end" });
    t.textContent = w.index === 0 ? "canary" : `wave ${w.index}`;
    svg.append(t);
    if (!w.started_at) return;
    const end = w.finished_at || (r.active ? now : r.finished_at || now);
    svg.append(svgEl("rect", { x: X(w.started_at), y, width: Math.max(2, X(end) - X(w.started_at)), height: 10,
      class: `wave-bar ${w.state}`, "data-wave": w.index }));
  });
  const end = svgEl("text", { x: W - R, y: H - 2, "text-anchor": "end" });
  end.textContent = `${clock(t0)} → ${r.finished_at ? clock(r.finished_at) : "now"}`;
  svg.append(end);
  return svg;
}
