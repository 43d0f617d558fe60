// Copy the onnxruntime-web files the page loads from node_modules into vendor/ (no CDN at run time), and
// record where they came from. Run after `npm ci`: `npm run vendor` (or `node scripts/vendor.mjs`).
import { createHash } from "node:crypto";
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const pkgDir = join(here, "node_modules", "onnxruntime-web");
const dist = join(pkgDir, "dist");
const out = join(here, "vendor");
// ort.wasm.min.mjs: WebAssembly only (ort-wasm-simd-threaded.*); ort.min.mjs: WebGPU + WebAssembly (the JSEP build).
const FILES = [
  "ort.wasm.min.mjs",
  "ort.min.mjs",
  "ort-wasm-simd-threaded.mjs",
  "ort-wasm-simd-threaded.wasm",
  "ort-wasm-simd-threaded.jsep.mjs",
  "ort-wasm-simd-threaded.jsep.wasm",
];

const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
const wanted = JSON.parse(readFileSync(join(here, "package.json"), "utf8")).dependencies["onnxruntime-web"];
if (pkg.version !== wanted) {
  console.error(`node_modules has onnxruntime-web ${pkg.version}, package.json pins ${wanted}: run npm ci`);
  process.exit(1);
}
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const files = {};
for (const name of FILES) {
  copyFileSync(join(dist, name), join(out, name));
  files[name] = createHash("sha256").update(readFileSync(join(out, name))).digest("hex");
}
// The package ships no LICENSE file; its license (MIT) is in package.json and in each bundle's header comment.
const record = { package: "onnxruntime-web", version: pkg.version, license: pkg.license, source: "npm registry", files };
writeFileSync(join(out, "vendor.json"), JSON.stringify(record, null, 2) + "\n");
console.log(`vendored onnxruntime-web ${pkg.version}: ${FILES.length} files in ${out}`);
