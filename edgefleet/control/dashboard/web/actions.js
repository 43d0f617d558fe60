// edgefleet dashboard: the operator's actions. Each is one POST (with the session's CSRF token) to the control
// plane, which runs the same operation as the command line and writes it to the audit trail.
"use strict";

function numberOrNull(id) {
  const text = document.getElementById(id).value.trim();
  if (text === "" || text.toLowerCase() === "none") return null;
  return Number(text);
}

async function rolloutAction(id, verb, button) {
  if ((verb === "abort" || verb === "rollback") && !confirm(`${verb} rollout ${id}? Its devices go back to their previous bundles.`)) return;
  button.disabled = true;
  const result = document.getElementById("rollout-result");
  await report(result, post(`/api/rollouts/${encodeURIComponent(id)}/${verb}`), (a) => `${verb} requested for ${a.rollout} (${a.state})`);
  refresh();
  refreshSlow();
}

document.getElementById("rollout-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const bundles = [...document.getElementById("rf-bundles").selectedOptions].map((o) => o.value);
  const drop = numberOrNull("rf-golden");
  const body = {
    bundles, group: document.getElementById("rf-group").value, slot: document.getElementById("rf-slot").value || "default",
    canary: document.getElementById("rf-canary").value, waves: document.getElementById("rf-waves").value,
    thresholds: {
      max_latency_factor: numberOrNull("rf-latency"), latency_slack_ms: Number(document.getElementById("rf-slack").value),
      max_error_rate: numberOrNull("rf-errors"),
      min_requests: Number(document.getElementById("rf-min-requests").value),
      max_golden_drop: drop === null ? -1 : drop,
    },
    timing: {
      baseline_s: Number(document.getElementById("rf-baseline").value), observe_s: Number(document.getElementById("rf-observe").value),
      install_timeout_s: Number(document.getElementById("rf-install").value),
      min_reports: Number(document.getElementById("rf-min-reports").value),
    },
    max_failed_devices: Number(document.getElementById("rf-max-failed").value),
  };
  await report(document.getElementById("rollout-result"), post("/api/rollouts", body),
    (r) => `started ${r.id}: waves of ${r.waves.map((w) => w.devices).join(", ")}`);
  refresh();
  refreshSlow();
});

document.getElementById("label-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const device = document.getElementById("lf-device").value;
  const body = { set: document.getElementById("lf-set").value, remove: document.getElementById("lf-remove").value };
  await report(document.getElementById("label-result"), post(`/api/devices/${encodeURIComponent(device)}/labels`, body),
    (a) => `${a.device_id}: ${Object.entries(a.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "(no labels)"}`);
  refresh();
  refreshSlow();
});

function desiredBody() {
  return {
    scope: document.getElementById("df-scope").value, target: document.getElementById("df-target").value.trim() || null,
    bundle: document.getElementById("df-bundle").value, rollback: document.getElementById("df-rollback").checked,
  };
}

document.getElementById("desired-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  await report(document.getElementById("desired-result"), post("/api/desired", desiredBody()),
    (a) => `${a.bundle} desired for ${a.scope} ${a.target} (${a.profile})`);
  refreshSlow();
});

document.getElementById("desired-clear").addEventListener("click", async () => {
  const body = desiredBody();
  const profile = (view.bundles.find((b) => b.bundle_id === body.bundle) || {}).profile || null;
  await report(document.getElementById("desired-result"),
    post("/api/desired/clear", { scope: body.scope, target: body.target, profile }), (a) => `removed ${a.removed}`);
  refreshSlow();
});

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": session.csrf || "" } });
  location.assign("/login");
});
