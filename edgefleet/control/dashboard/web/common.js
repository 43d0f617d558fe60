// edgefleet dashboard: what every part of the page shares (DOM helpers, the API with its CSRF token).
// No libraries, no network beyond this origin.
"use strict";

const session = { user: null, csrf: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
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

function clock(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString() : "-";
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (response.status === 401) { location.assign("/login"); throw new Error("logged out"); }
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// A state-changing request: JSON body, this session's CSRF token. Resolves to the answer; rejects with its error.
async function post(path, body = {}) {
  const response = await fetch(path, {
    method: "POST", credentials: "same-origin", cache: "no-store",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": session.csrf || "" },
    body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
  return answer;
}

async function loadSession() {
  const me = await getJSON("/api/session");
  session.user = me.user;
  session.csrf = me.csrf;
  document.getElementById("user").textContent = `signed in as ${me.user}`;
}

// Replace a <select>'s options only when they changed, keeping what the operator chose.
function setOptions(select, values, labelOf = (v) => v) {
  const now = [...select.options].map((o) => o.value).join("\n");
  if (now === values.join("\n")) return;
  const chosen = new Set([...select.selectedOptions].map((o) => o.value));
  select.replaceChildren(...values.map((v) => {
    const option = el("option", { value: v, text: labelOf(v) });
    option.selected = chosen.has(v);
    return option;
  }));
}

function report(node, promise, ok) {
  node.className = "result";
  node.textContent = "…";
  return promise.then((answer) => {
    node.className = "result ok";
    node.textContent = ok(answer);
    return answer;
  }, (err) => {
    node.className = "result error";
    node.textContent = err.message;
  });
}
