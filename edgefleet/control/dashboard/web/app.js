// edgefleet dashboard: polls the control plane's JSON API and draws the fleet, the plots and the rollouts.
"use strict";

const STATE_COLORS = {
  passed: "#2ca02c", installed: "#98df8a", deploying: "#1f77b4", baseline: "#aec7e8", waiting: "#e5e7eb",
  failed: "#d62728", "timed-out": "#ff7f0e", "rolling-back": "#ff9896", "rolled-back": "#9467bd",
  "rollback-timed-out": "#8c564b", kept: "#bcbd22", refused: "#e377c2",
};
const MAX_CHARTS = 12;
const view = { devices: [], selected: new Set(), chosenByUser: false, filter: "", groups: [], bundles: [] };

// --- fleet table
function renderFleet(data) {
  view.devices = data.devices;
  const online = data.devices.filter((d) => d.online).length;
  const c = data.counters || {};
  const engine = data.engine ? (data.engine.state === "running" ? `engine: ${data.engine.holder}` :
    `engine ${data.engine.state}: ${data.engine.detail}`) : "engine: never ran";
  const summary = document.getElementById("summary");
  summary.classList.toggle("alarm", !!data.engine && data.engine.state !== "running");
  summary.title = (data.health || []).map((h) => `${h.component} (${h.instance}): ${h.state}, ${h.detail}`).join("\n");
  summary.textContent =
    `${online}/${data.devices.length} devices online · ${c["ingest.telemetry"] || 0} reports stored · ` +
    `${c["ingest.duplicates"] || 0} duplicates · ${(c["ingest.malformed"] || 0) + (c["ingest.unknown_device"] || 0) +
    (c["ingest.mismatched"] || 0)} refused · ${engine}`;
  if (!view.chosenByUser) view.selected = new Set(data.devices.slice(0, 6).map((d) => d.device_id));
  const needle = view.filter.toLowerCase();
  const rows = [];
  for (const d of data.devices) {
    const text = `${d.device_id} ${d.profile} ${d.bundle} ${d.state} ${Object.entries(d.labels).join(" ")}`.toLowerCase();
    if (needle && !text.includes(needle)) continue;
    const labels = Object.entries(d.labels).map(([k, v]) => `${k}=${v}`).concat(d.groups.map((g) => `group=${g}`));
    const tr = el("tr", { "data-device": d.device_id, class: view.selected.has(d.device_id) ? "selected" : "" },
      el("td", { text: d.device_id }),
      el("td", {}, el("span", { class: `dot ${d.online ? "on" : "off"}`, title: d.online ? "online" : "offline" })),
      el("td", { class: "state", text: d.state + (d.warnings && d.warnings.length ? ` ⚠ ${d.warnings.join("; ")}` : "") }),
      el("td", { text: d.profile || "-" }), el("td", { text: d.agent_version || "-", title: "agent version" }),
      el("td", { class: "slots", text: slotsText(d) }),
      el("td", { text: d.verified ? "yes" : "no" }),
      el("td", { class: "num", text: fmt(d.p50_ms) }), el("td", { class: "num", text: fmt(d.p95_ms) }),
      el("td", { class: "num", text: fmt(d.golden_agreement, 2) }),
      el("td", { class: "num", text: fmt(d.ttft_p50_ms), title: "time to first token, median (language models)" }),
      el("td", { class: "num", text: fmt(d.tokens_per_s, 1), title: "output tokens per second (language models)" }),
      el("td", { class: "num", text: fmt(d.cpu_percent, 0) }),
      el("td", { class: "num", text: fmt(d.rss_mb, 0) }), el("td", { class: "labels", text: labels.join(", ") }),
      el("td", { text: ago(d.telemetry_age_s ?? d.status_age_s) }));
    tr.addEventListener("click", () => toggle(d.device_id));
    rows.push(tr);
  }
  document.querySelector("#fleet tbody").replaceChildren(...rows);
  setOptions(document.getElementById("lf-device"), data.devices.map((d) => d.device_id));
}

// One line per slot (the model it runs): "detector: bundle (provider, p95 ms, memory MB)"; a single model shows its
// bundle alone.
function slotsText(d) {
  const slots = d.slots || [];
  if (!slots.length) return d.bundle || "-";
  if (slots.length === 1 && slots[0].slot === "default" && !slots[0].refused) return slots[0].bundle || "-";
  return slots.map((s) => {
    const figures = [s.provider, s.p95_ms != null ? `p95 ${fmt(s.p95_ms)} ms` : null,
      s.memory_mb != null ? `${fmt(s.memory_mb, 0)} MB` : null, s.drift_band ? `drift ${s.drift_band}` : null]
      .filter((x) => x);
    const refused = s.refused ? ` refused: ${s.refused}` : "";
    return `${s.slot}: ${s.bundle || "-"}${figures.length ? ` (${figures.join(", ")})` : ""}${refused}`;
  }).join("\n");
}

function toggle(deviceId) {
  if (!view.chosenByUser) { view.selected = new Set(); view.chosenByUser = true; }
  if (view.selected.has(deviceId)) view.selected.delete(deviceId);
  else if (view.selected.size < MAX_CHARTS) view.selected.add(deviceId);
  for (const tr of document.querySelectorAll("#fleet tbody tr")) tr.classList.toggle("selected", view.selected.has(tr.dataset.device));
  refreshCharts();
}

// --- plots
async function refreshCharts() {
  const windowS = Number(document.getElementById("window").value);
  const ids = [...view.selected].slice(0, MAX_CHARTS);
  const cards = await Promise.all(ids.map(async (id) => {
    try {
      const data = await getJSON(`/api/devices/${encodeURIComponent(id)}/series?window=${windowS}&points=240`);
      const last = data.points.length ? data.points[data.points.length - 1] : null;
      return plotCard(id, last && last.bundle ? last.bundle : "", data, { "data-device": id });
    } catch (err) {
      return el("div", { class: "card", text: `${id}: ${err.message}` });
    }
  }));
  document.getElementById("charts").replaceChildren(...cards);
  const group = document.getElementById("group-chart").value;
  const box = document.getElementById("group-charts");
  if (!group) { box.replaceChildren(); return; }
  try {
    const data = await getJSON(`/api/groups/${encodeURIComponent(group)}/series?window=${windowS}&points=120`);
    box.replaceChildren(plotCard(`group ${group}`, `${data.members.length} devices; mean of members, p95_ms_max the worst`,
      data, { "data-group": group }));
  } catch (err) {
    box.replaceChildren(el("div", { class: "card", text: `${group}: ${err.message}` }));
  }
}

// --- rollouts
function rolloutButtons(r) {
  const buttons = el("span", { class: "buttons" });
  const verbs = [];
  if (r.state === "pending" || r.state === "running") verbs.push("pause");
  if (r.state === "paused") verbs.push("resume");
  if (r.active && r.state !== "rolling-back") verbs.push("abort");
  if (r.can_roll_back && !r.active) verbs.push("rollback");
  for (const verb of verbs) {
    const button = el("button", { type: "button", class: `act ${verb}`, "data-action": verb, text: verb });
    button.addEventListener("click", () => rolloutAction(r.id, verb, button));
    buttons.append(button);
  }
  return buttons;
}

function findingsTable(wave) {
  const details = el("details", { class: "findings", "data-wave": wave.index });
  details.append(el("summary", { text: `${wave.index === 0 ? "canary" : `wave ${wave.index}`}: ${wave.verdict || wave.state}` }));
  const rows = wave.findings.map((d) => el("tr", { "data-device": d.device_id },
    el("td", { text: d.device_id }), el("td", { text: d.state }), el("td", { class: "num", text: fmt(d.baseline_p95_ms) }),
    el("td", { class: "num", text: fmt(d.p95_ms) }), el("td", { class: "num", text: fmt(d.golden_agreement, 3) }),
    el("td", { text: [...d.findings.map((f) => `${f.ok === true ? "✓" : f.ok === false ? "✗" : "…"} ${f.criterion}: ${f.detail}`),
      ...d.warnings.map((w) => `⚠ ${w}`), ...(d.reported_bundle && d.reported_bundle !== d.rollback_target && d.rollback_note
        ? [`⚠ reports ${d.reported_bundle}; rollback: ${d.rollback_note}`] : [])].join("\n") || d.reason })));
  details.append(el("table", {}, el("thead", {}, el("tr", {}, ...["device", "state", "baseline p95", "p95", "golden", "findings"]
    .map((h) => el("th", { text: h })))), el("tbody", {}, ...rows)));
  return details;
}

const openFindings = new Set();

function renderRollouts(data) {
  const container = document.getElementById("rollouts");
  for (const d of container.querySelectorAll("details.findings[open]")) openFindings.add(`${d.closest(".rollout").dataset.rollout}/${d.dataset.wave}`);
  for (const d of container.querySelectorAll("details.findings:not([open])")) openFindings.delete(`${d.closest(".rollout").dataset.rollout}/${d.dataset.wave}`);
  if (!data.rollouts.length) { container.replaceChildren(el("p", { class: "muted", text: "none yet" })); return; }
  const now = Date.now() / 1000;
  container.replaceChildren(...data.rollouts.map((r) => {
    const box = el("div", { class: "rollout", "data-rollout": r.id, "data-state": r.state });
    box.append(el("div", { class: "head" },
      el("strong", { text: r.id }), el("span", { class: `badge ${r.state}`, text: r.state }),
      el("span", { class: "muted", text: `group ${r.group} · slot ${r.slot || "default"} · ${r.bundles.join(", ")}` }), rolloutButtons(r)));
    const waves = el("div", { class: "waves" });
    for (const w of r.waves) {
      const bar = el("div", { class: "bar", title: JSON.stringify(w.counts) });
      for (const [s, n] of Object.entries(w.counts)) {
        bar.append(el("span", { style: `width:${(100 * n) / w.devices}%;background:${STATE_COLORS[s] || "#999"}`, title: `${s}: ${n}` }));
      }
      waves.append(el("div", { class: "wave", "data-wave": w.index, "data-state": w.state },
        el("span", { text: `${w.index === 0 ? "canary" : `wave ${w.index}`} (${w.devices})` }), bar,
        el("span", { class: "muted", text: w.verdict || w.state })));
    }
    box.append(waves, timeline(r, now));
    for (const w of r.waves) {
      if (!w.started_at) continue;
      const details = findingsTable(w);
      details.open = openFindings.has(`${r.id}/${w.index}`);
      box.append(details);
    }
    if (r.outcome) box.append(el("div", { class: "outcome", text: r.outcome }));
    const leftOut = Object.entries(r.left_out || {});
    if (leftOut.length) {
      box.append(el("div", { class: "left-out", text: `⚠ left out (their own report claims ${r.group}, the registry does not): `
        + leftOut.slice(0, 5).map(([d, why]) => `${d}: ${why}`).join("; ") }));
    }
    if (r.failures.length) {
      box.append(el("div", { class: "failures", text: r.failures.slice(0, 5).map((f) => `${f.device_id} ${f.state}: ${f.reason}`).join("\n") }));
    }
    const lines = r.log.map((e) => `${clock(e.ts)} ${e.message}`).reverse();
    box.append(el("div", { class: "log", text: lines.join("\n") }));
    return box;
  }));
}

// --- desired state, audit
function renderDesired(data) {
  document.querySelector("#desired tbody").replaceChildren(...data.deployments.map((d) => el("tr", {},
    el("td", { text: d.scope }), el("td", { text: d.target }), el("td", { text: d.profile }), el("td", { text: d.bundle_id }),
    el("td", { text: d.rollback ? "yes" : "" }), el("td", { text: d.source }))));
}

function renderAudit(data) {
  document.querySelector("#audit tbody").replaceChildren(...data.entries.map((e) => el("tr", { "data-action": e.action, "data-outcome": e.outcome.split(":")[0] },
    el("td", { text: clock(e.ts) }), el("td", { text: e.actor }), el("td", { text: e.via }), el("td", { text: e.action }),
    el("td", { text: e.target }), el("td", { text: e.outcome }),
    el("td", { class: "detail", text: Object.keys(e.detail).length ? JSON.stringify(e.detail) : "" }))));
}

function renderChoices(groups, bundles) {
  view.groups = groups.groups;
  view.bundles = bundles.bundles;
  const names = groups.groups.map((g) => g.name);
  const plannable = groups.groups.filter((g) => g.plannable).map((g) => g.name);  // the host's records alone
  setOptions(document.getElementById("rf-group"), plannable, (n) => {
    const g = groups.groups.find((x) => x.name === n);
    const out = Object.keys(g.left_out).length;
    return `${n} (${g.rollout_members.length}${out ? `; ${out} left out: not in the registry` : ""})`;
  });
  const chart = document.getElementById("group-chart");
  setOptions(chart, ["", ...names], (n) => n || "(none)");
  const ids = bundles.bundles.map((b) => b.bundle_id);
  const label = (id) => { const b = bundles.bundles.find((x) => x.bundle_id === id); return `${id} (${b.profile}, v${b.model_version})`; };
  setOptions(document.getElementById("rf-bundles"), ids, label);
  setOptions(document.getElementById("df-bundle"), ids, label);
}

async function refresh() {
  try {
    const [fleet, rollouts] = await Promise.all([getJSON("/api/fleet"), getJSON("/api/rollouts")]);
    renderFleet(fleet);
    renderRollouts(rollouts);
    document.body.dataset.loaded = "true";
  } catch (err) {
    summary.textContent = `cannot reach the control plane: ${err.message}`;
  }
}

async function refreshSlow() {
  try {
    const [groups, bundles, desired, audit] = await Promise.all(
      ["/api/groups", "/api/bundles", "/api/desired", "/api/audit"].map(getJSON));
    renderChoices(groups, bundles);
    renderDesired(desired);
    renderAudit(audit);
  } catch (err) {
    summary.textContent = `cannot reach the control plane: ${err.message}`;
  }
}

document.getElementById("filter").addEventListener("input", (e) => { view.filter = e.target.value; refresh(); });
document.getElementById("window").addEventListener("change", refreshCharts);
document.getElementById("group-chart").addEventListener("change", refreshCharts);

(async function main() {
  await loadSession();
  await Promise.all([refresh(), refreshSlow()]);
  await refreshCharts();
  document.body.dataset.charts = "true";
  setInterval(refresh, 2000);
  setInterval(refreshSlow, 3000);
  setInterval(refreshCharts, 5000);
})();
