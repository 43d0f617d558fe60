// edgefleet dashboard, model-quality panel: per device and group golden scores per output, field accuracy,
// drift bands (with a PSI sparkline) and shadow against served, from /api/quality. Self-contained, no libraries.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const BAND_COLORS = { none: "#2ca02c", moderate: "#ff7f0e", drift: "#d62728" };

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function num(value, digits) {
    return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
  }

  function sparkline(series) {
    const width = 120, height = 24, svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark"); svg.setAttribute("width", width); svg.setAttribute("height", height);
    if (series.length < 2) return svg;
    const t0 = series[0][0], t1 = series[series.length - 1][0] || t0 + 1;
    const top = Math.max(0.3, ...series.map((p) => p[1]));
    const d = series.map(([t, v], i) => `${i ? "L" : "M"}${((t - t0) / (t1 - t0 || 1)) * width},${height - (v / top) * height}`);
    const guide = document.createElementNS(SVG, "line");  // the 0.25 "drift" band edge
    const y = height - (0.25 / top) * height;
    Object.entries({ x1: 0, x2: width, y1: y, y2: y, class: "band-edge" }).forEach(([k, v]) => guide.setAttribute(k, v));
    const path = document.createElementNS(SVG, "path");
    path.setAttribute("d", d.join(""));
    path.setAttribute("class", "psi");
    svg.append(guide, path);
    return svg;
  }

  function goldenCell(bundles) {
    const cell = el("td", { class: "golden" });
    for (const b of bundles) {
      const t = b.golden_task;
      if (t && t.computable) {  // the bundle's task rule, as the device's golden check applied it
        cell.append(el("div", {
          class: t.passed ? "ok task" : "fail task", "data-bundle": b.bundle, "data-metric": t.metric,
          "data-score": String(t.score), text: `${b.bundle}: task ${t.metric} ${num(t.score, 4)} (floor ${num(t.floor, 4)})${t.passed ? "" : " FAIL"}`,
        }));
      }
      for (const g of b.golden) {
        const tag = el("div", {
          class: g.passed ? "ok" : "fail", "data-output": g.output, "data-rule": g.rule, "data-bundle": b.bundle,
          "data-passed": String(g.passed), text: `${b.bundle}: ${g.output} ${g.rule} ${num(g.score, 4)}${g.passed ? "" : " FAIL"}`,
        });
        cell.append(tag);
      }
    }
    return cell;
  }

  function fieldCell(bundles) {
    const cell = el("td", { class: "field" });
    for (const b of bundles.filter((x) => x.field_accuracy !== null)) {
      cell.append(el("div", {
        class: b.field_regression ? "fail regression" : "ok", "data-bundle": b.bundle,
        "data-regression": String(b.field_regression),
        text: `${b.bundle}: ${num(b.field_accuracy, 3)} (n=${b.field_samples})${b.field_regression ? " ▼ regression" : ""}`,
      }));
    }
    return cell;
  }

  function shadowCell(bundles) {
    const cell = el("td", { class: "shadow" });
    for (const b of bundles.filter((x) => x.shadow)) {
      const s = b.shadow;
      const agrees = s.passed && s.agreement !== null && s.agreement >= 0.99;
      cell.append(el("div", {
        class: agrees ? "ok" : "fail", "data-shadow": agrees ? "agree" : "disagree", "data-bundle": s.bundle,
        text: `${s.bundle} beside ${b.bundle}: agreement ${num(s.agreement, 4)} over ${s.requests}, ` +
          `p95 ${num(s.p95_ms, 3)} vs served ${num(s.served_p95_ms, 3)} ms`,
      }));
    }
    return cell;
  }

  function render(data) {
    const root = document.getElementById("quality");
    if (!root) return;
    const devices = el("table", { id: "quality-devices" });
    devices.append(el("thead", {}, el("tr", {}, ...["device", "drift", "PSI", "golden per output", "field accuracy",
      "shadow vs served"].map((h) => el("th", { text: h })))));
    const body = el("tbody");
    for (const d of data.devices) {
      const band = d.drift_band || "";
      const driftCell = el("td", { class: "drift", "data-band": band },
        el("span", { class: "band", style: `background:${BAND_COLORS[band] || "#e5e7eb"}`, text: band || "-" }),
        el("span", { class: "muted small", text: d.drift_name ? ` ${d.drift_name} ${num(d.drift_psi, 3)}` : "" }));
      body.append(el("tr", { "data-device": d.device_id },
        el("td", { text: d.device_id }), driftCell, el("td", {}, sparkline(d.drift_series)),
        goldenCell(d.bundles), fieldCell(d.bundles), shadowCell(d.bundles)));
    }
    devices.append(body);
    const groups = el("table", { id: "quality-groups" });
    groups.append(el("thead", {}, el("tr", {}, ...["group", "devices", "lowest golden", "field accuracy",
      "worst drift", "drifting", "PSI"].map((h) => el("th", { text: h })))));
    const gbody = el("tbody");
    for (const g of data.groups) {
      gbody.append(el("tr", { "data-group": g.group }, el("td", { text: g.group }), el("td", { text: String(g.devices) }),
        el("td", { text: num(g.golden_min, 4) }), el("td", { text: num(g.field_accuracy, 3) }),
        el("td", { "data-band": g.drift_worst || "", text: g.drift_worst || "-" }), el("td", { text: String(g.drifting) }),
        el("td", {}, sparkline(g.drift_series))));
    }
    groups.append(gbody);
    const alerts = el("ul", { id: "quality-alerts" });
    for (const a of data.alerts.slice().reverse()) {
      alerts.append(el("li", { class: `alert ${a.level}`, "data-kind": a.kind, "data-device": a.device_id,
        text: `${new Date(a.ts * 1000).toLocaleTimeString()} ${a.device_id}: ${a.detail}` }));
    }
    root.replaceChildren(
      data.devices.length ? devices : el("p", { class: "muted", text: "no device reports quality figures yet" }),
      el("h3", { text: "Groups" }), groups, el("h3", { text: "Alerts" }),
      data.alerts.length ? alerts : el("p", { class: "muted", text: "none" }));
    document.body.dataset.quality = "true";
  }

  async function refresh() {
    try {
      const response = await fetch("/api/quality?window=1800", { cache: "no-store" });
      if (response.ok) render(await response.json());
    } catch (err) {
      console.warn("quality panel:", err);
    }
  }

  refresh();
  setInterval(refresh, 3000);
})();
