// edgefleet browser runner: the browser-wasm "device". It takes a bundle (a tar: manifest.json, signature.json and
// the files the manifest pins), refuses it before loading anything when it is over this page's size limit or not
// a browser bundle, checks the ed25519 signature (when given a trusted key) and every file's sha256, then loads the
// model with onnxruntime-web (vendor/, copied from the npm package by scripts/vendor.mjs) and runs the golden set
// the converter exported as golden.json, judging the outputs as the agent does (edgefleet/core/golden.py).
//
// URL parameters: bundle=URL (else pick a file), trust=BASE64 (raw 32-byte ed25519 public key; repeatable),
// limit_mb=N (default: the browser-wasm profile's size_limit_mb), ep=wasm|webgpu, threads=N (default 1).
// The outcome is shown and left in `window.edgefleet` (state: passed | failed | refused | error).

export const PROFILE = "browser-wasm";
export const SIZE_LIMIT_MB = 50; // device_profiles/browser-wasm.yaml size_limit_mb
const VENDOR = new URL("vendor/", import.meta.url).href;

class Refused extends Error {}

const params = new URLSearchParams(location.search);
const log = (text) => {
  const item = document.createElement("li");
  item.textContent = text;
  document.getElementById("log").append(item);
};

function show(result) {
  window.edgefleet = { ...result, done: true };
  const state = document.getElementById("state");
  state.className = `state ${result.state}`;
  state.textContent = `${result.state}: ${result.reason}`;
  const facts = document.getElementById("facts");
  facts.replaceChildren();
  for (const [key, value] of Object.entries(result.facts ?? {})) {
    const row = facts.insertRow();
    row.insertCell().textContent = key;
    row.insertCell().textContent = String(value);
  }
  facts.hidden = !result.facts;
}

// --- tar, as Python's tarfile writes it (ustar entries, pax 'x' headers for long or non-ASCII paths)
function text(bytes, start, length) {
  const field = bytes.subarray(start, start + length);
  const end = field.indexOf(0);
  return new TextDecoder().decode(end < 0 ? field : field.subarray(0, end));
}

function paxRecords(data) {
  const records = {};
  const source = new TextDecoder().decode(data);
  let offset = 0;
  while (offset < source.length) {
    const space = source.indexOf(" ", offset);
    const length = parseInt(source.slice(offset, space), 10);
    if (!(length > 0)) break;
    const record = source.slice(space + 1, offset + length - 1);
    const equals = record.indexOf("=");
    records[record.slice(0, equals)] = record.slice(equals + 1);
    offset += length;
  }
  return records;
}

export function untar(bytes) {
  const entries = new Map();
  let offset = 0;
  let pax = {};
  while (offset + 512 <= bytes.length) {
    const header = bytes.subarray(offset, offset + 512);
    if (header.every((b) => b === 0)) break;
    const size = parseInt(text(header, 124, 12).trim() || "0", 8);
    const type = String.fromCharCode(header[156] || 48);
    const start = offset + 512;
    if (start + size > bytes.length) throw new Refused("the bundle is truncated");
    const data = bytes.subarray(start, start + size);
    offset = start + Math.ceil(size / 512) * 512;
    if (type === "x") { pax = paxRecords(data); continue; }
    if (type === "g") continue;
    const prefix = text(header, 345, 155);
    const path = pax.path ?? (prefix ? `${prefix}/${text(header, 0, 100)}` : text(header, 0, 100));
    pax = {};
    if (type !== "0") throw new Refused(`bundle entry ${path} is not a regular file`);
    if (entries.has(path)) throw new Refused(`bundle entry ${path} appears twice`);
    entries.set(path, data);
  }
  return entries;
}

// --- verification
const hex = (buffer) => [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
const fromBase64 = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));

async function verifySignature(manifestBytes, signature, trusted) {
  if (!trusted.length) return "not checked (no trusted key given: add ?trust=BASE64)";
  for (const b64 of trusted) {
    // Accept base64url, and '+' turned into ' ' by an unencoded query string.
    const raw = fromBase64(b64.trim().replaceAll(" ", "+").replaceAll("-", "+").replaceAll("_", "/"));
    const keyId = hex(await crypto.subtle.digest("SHA-256", raw)).slice(0, 16);
    if (keyId !== signature.key_id) continue;
    const key = await crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
    const ok = await crypto.subtle.verify({ name: "Ed25519" }, key, fromBase64(signature.signature), manifestBytes);
    if (!ok) throw new Refused(`signature by key ${signature.key_id} does not verify`);
    return `ed25519, key ${keyId}`;
  }
  throw new Refused(`signed by untrusted key ${signature.key_id}`);
}

async function verifyFiles(entries, manifest) {
  const pinned = new Map(manifest.files.map((f) => [f.path, f]));
  for (const path of entries.keys()) {
    if (path !== "manifest.json" && path !== "signature.json" && !pinned.has(path)) {
      throw new Refused(`bundle holds ${path}, which the manifest does not pin`);
    }
  }
  for (const entry of manifest.files) {
    const data = entries.get(entry.path);
    if (!data) throw new Refused(`bundle is missing pinned file ${entry.path}`);
    if (data.length !== entry.size) throw new Refused(`${entry.path}: size ${data.length}, manifest says ${entry.size}`);
    if (hex(await crypto.subtle.digest("SHA-256", data)) !== entry.sha256) {
      throw new Refused(`${entry.path}: sha256 does not match the manifest (tampered or corrupt)`);
    }
  }
}

// --- tensors
const TYPED = {
  float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array,
  int8: Int8Array, uint8: Uint8Array, bool: Uint8Array,
};

function decode(tensor) {
  const Kind = TYPED[tensor.dtype];
  if (!Kind) throw new Refused(`golden tensor dtype ${tensor.dtype} is not supported by this page`);
  const bytes = fromBase64(tensor.data);
  return new Kind(bytes.buffer, bytes.byteOffset, bytes.byteLength / Kind.BYTES_PER_ELEMENT);
}

function encode(values) {
  const bytes = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

function argmaxRows(values, rows) {
  const width = values.length / rows;
  const found = [];
  for (let r = 0; r < rows; r++) {
    let best = 0;
    for (let i = 1; i < width; i++) if (values[r * width + i] > values[r * width + best]) best = i;
    found.push(best);
  }
  return found;
}

// --- running
async function hasWebGpu() {
  try {
    return Boolean("gpu" in navigator && (await navigator.gpu.requestAdapter()));
  } catch {
    return false;
  }
}

async function providersFor(manifest) {
  const asked = params.get("ep");
  const allowed = manifest.providers.filter((p) => p.startsWith("web:")).map((p) => p.slice(4));
  if (!allowed.length) throw new Refused(`not a browser bundle: its providers are ${manifest.providers.join(", ")}`);
  const gpu = allowed.includes("webgpu") && (await hasWebGpu());
  const here = allowed.filter((p) => p === "wasm" || (p === "webgpu" && gpu));
  const chosen = asked ? here.filter((p) => p === asked) : here;
  if (!chosen.length) throw new Refused(`none of ${allowed.join(", ")} is available in this browser`);
  return chosen;
}

async function loadOrt(providers) {
  const ort = await import(providers.includes("webgpu") ? `${VENDOR}ort.min.mjs` : `${VENDOR}ort.wasm.min.mjs`);
  ort.env.wasm.wasmPaths = VENDOR;
  ort.env.wasm.numThreads = Number(params.get("threads") ?? 1);
  ort.env.logLevel = "error";
  return ort;
}

function checkSize(size, limitMb) {
  if (size > limitMb * 1e6) {
    throw new Refused(`bundle is ${(size / 1e6).toFixed(1)} MB; profile ${PROFILE} allows ${limitMb} MB`);
  }
}

export async function runBundle(bytes, { limitMb = SIZE_LIMIT_MB, trusted = [] } = {}) {
  checkSize(bytes.length, limitMb);
  const entries = untar(bytes);
  const manifestBytes = entries.get("manifest.json");
  const signatureBytes = entries.get("signature.json");
  if (!manifestBytes || !signatureBytes) throw new Refused("not an edgefleet bundle (no manifest.json/signature.json)");
  const manifest = JSON.parse(new TextDecoder().decode(manifestBytes));
  const signature = JSON.parse(new TextDecoder().decode(signatureBytes));
  const signed = await verifySignature(manifestBytes, signature, trusted);
  log(`signature ${signed}`);
  if (manifest.profile !== PROFILE) throw new Refused(`bundle is built for profile ${manifest.profile}; this page is ${PROFILE}`);
  if (!manifest.web) throw new Refused(`not a browser bundle (format ${manifest.format}, no web options)`);
  await verifyFiles(entries, manifest);
  log(`${manifest.files.length} files match their sha256`);
  const providers = await providersFor(manifest);
  const ort = await loadOrt(providers);
  const started = performance.now();
  const session = await ort.InferenceSession.create(entries.get(manifest.model_path), { executionProviders: providers });
  const loadMs = performance.now() - started;
  log(`model loaded with onnxruntime-web ${ort.env.versions?.web ?? ""} on ${providers.join(", ")} in ${loadMs.toFixed(1)} ms`);

  const golden = JSON.parse(new TextDecoder().decode(entries.get(manifest.web.golden_json)));
  const specs = new Map(manifest.inputs.map((s) => [s.name, s]));
  const names = manifest.outputs.map((o) => o.name);
  const stacked = Object.fromEntries(names.map((n) => [n, []]));
  const times = [];
  for (const sample of golden.inputs) {
    const feeds = {};
    for (const [name, tensor] of Object.entries(sample)) {
      if (!specs.has(name)) throw new Refused(`golden input ${name} is not a model input`);
      feeds[name] = new ort.Tensor(tensor.dtype === "bool" ? "bool" : tensor.dtype, decode(tensor), tensor.shape);
    }
    const t0 = performance.now();
    const result = await session.run(feeds);
    times.push(performance.now() - t0);
    for (const name of names) stacked[name].push(result[name]);
  }
  const outputs = {};
  let maxAbs = 0;
  for (const name of names) {
    const parts = stacked[name];
    const values = new Float32Array(parts.reduce((n, t) => n + t.data.length, 0));
    let at = 0;
    for (const t of parts) { values.set(Array.from(t.data, Number), at); at += t.data.length; }
    const expected = golden.expected[name];
    const want = decode(expected);
    if (want.length !== values.length) maxAbs = Infinity;
    for (let i = 0; i < Math.min(want.length, values.length); i++) {
      const diff = Math.abs(values[i] - Number(want[i]));
      maxAbs = Number.isNaN(diff) ? Infinity : Math.max(maxAbs, diff);
    }
    outputs[name] = { dtype: "float32", shape: [golden.count, ...parts[0].dims], data: encode(values) };
  }
  const first = Object.keys(golden.reference)[0];
  const got = argmaxRows(decode(outputs[first]), golden.count);
  const ref = argmaxRows(Float32Array.from(decode(golden.reference[first]), Number), golden.count);
  const agreement = got.filter((v, i) => v === ref[i]).length / golden.count;
  times.sort((a, b) => a - b);
  const facts = {
    bundle: manifest.bundle_id, model: `${manifest.model_name} ${manifest.model_version}`,
    recipe: manifest.recipe.name, format: manifest.web.ort_format ? "ORT" : "ONNX", providers: providers.join(", "),
    "golden samples": golden.count, "max |error|": maxAbs.toPrecision(3), tolerance: golden.max_abs_error.toPrecision(3),
    "argmax agreement": agreement.toFixed(3), "median run ms": times[times.length >> 1].toFixed(3),
  };
  let state = "passed";
  let reason = `agreement ${agreement.toFixed(3)}, max |error| ${maxAbs.toPrecision(3)}`;
  if (!(maxAbs <= golden.max_abs_error)) {
    state = "failed";
    reason = `max |error| ${maxAbs.toPrecision(3)} exceeds the tolerance ${golden.max_abs_error.toPrecision(3)}`;
  } else if (agreement < golden.min_agreement) {
    state = "failed";
    reason = `argmax agreement ${agreement.toFixed(3)} is below ${golden.min_agreement.toFixed(3)}`;
  }
  return {
    state, reason, facts, outputs, bundle_id: manifest.bundle_id, providers, max_abs_error: maxAbs, agreement,
    load_ms: loadMs, median_run_ms: times[times.length >> 1],
  };
}

async function run(load) {
  show({ state: "idle", reason: "loading" });
  window.edgefleet = { done: false };
  const limitMb = Number(params.get("limit_mb") ?? SIZE_LIMIT_MB);
  try {
    const bytes = await load(limitMb);
    const result = await runBundle(bytes, { limitMb, trusted: params.getAll("trust") });
    show(result);
  } catch (err) {
    const state = err instanceof Refused ? "refused" : "error";
    show({ state, reason: err?.message ?? String(err) });
  }
}

document.getElementById("file").addEventListener("change", (event) => {
  const file = event.target.files[0];
  if (file) {
    run(async (limitMb) => {
      checkSize(file.size, limitMb); // refused before reading it
      return new Uint8Array(await file.arrayBuffer());
    });
  }
});

const url = params.get("bundle");
if (url) {
  run(async (limitMb) => {
    const head = await fetch(url, { method: "HEAD" });
    const length = Number(head.headers.get("content-length"));
    if (head.ok && length) checkSize(length, limitMb); // refused before downloading it
    const response = await fetch(url);
    if (!response.ok) throw new Error(`cannot fetch ${url}: HTTP ${response.status}`);
    return new Uint8Array(await response.arrayBuffer());
  });
} else {
  window.edgefleet = { done: false, state: "idle" };
}
