"""Browser bundles (browser-wasm) and the static page in deploy/web: the converter checks operators against the WASM
EP, caps the IR version, writes the golden set as JSON and keeps the size limit; the page, driven in headless
Chromium (Debian's `chromium`, through Playwright with executable_path), verifies a bundle, runs its golden set
with the vendored onnxruntime-web and reports outputs that this test checks against the golden set itself.

Needs the vendored assets: `cd deploy/web && npm ci && npm run vendor` (the fixture runs that when npm exists)."""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import onnx
import pytest

from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.passes import web
from edgefleet.core.bundle.archive import unpack_bundle
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.quality.golden import GoldenSet, compare
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import padded_bundle
from support.paths import DIGITS, REPO

WEB = REPO / "deploy" / "web"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip


@pytest.fixture(scope="session")
def web_assets() -> Path:
    """deploy/web with onnxruntime-web vendored from the npm registry (package-lock.json pins it)."""
    if not (WEB / "vendor" / "vendor.json").is_file():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("deploy/web/vendor is missing and there is no npm: cd deploy/web && npm ci && npm run vendor")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WEB, check=True, capture_output=True, timeout=600)
        subprocess.run([npm, "run", "vendor"], cwd=WEB, check=True, capture_output=True, timeout=120)
    return WEB


@pytest.fixture(scope="module")
def web_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """The digits CNN for browser-wasm as the profile has it (ONNX), and with ort_format on."""
    out = tmp_path_factory.mktemp("web")
    profile = get_profile("browser-wasm")
    ort_format = profile.model_copy(update={"targets": [profile.targets[0].model_copy(update={"ort_format": True})]})
    found = {}
    for label, chosen in (("onnx", profile), ("ort", ort_format)):
        (result,) = convert(
            ConvertRequest(
                model=DIGITS / "digits_cnn.onnx", profiles=[chosen], calib=DIGITS / "calib.npz",
                eval=DIGITS / "eval.npz", out=out / label, key=signing_key, name="digits", version="1", report=False,
            )
        )  # fmt: skip
        assert result.bundle, result.error
        found[label] = Path(result.bundle)
    return found


class _Handler(SimpleHTTPRequestHandler):
    extensions_map = {  # noqa: RUF012 - the base class's own (mutable) attribute, extended
        **SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
    }
    bundles: Path
    requests: list[str]

    def translate_path(self, path: str) -> str:
        if path.startswith("/bundles/"):
            return str(self.bundles / path.split("?")[0].removeprefix("/bundles/"))
        return super().translate_path(path)

    def log_message(self, format: str, *args: Any) -> None:
        self.requests.append(f"{self.command} {self.path}")


@pytest.fixture(scope="module")
def server(web_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    """(base URL, folder served under /bundles/, request log): deploy/web over HTTP on a free loopback port."""
    bundles = tmp_path_factory.mktemp("served")
    log: list[str] = []
    handler = type("Handler", (_Handler,), {"bundles": bundles, "requests": log})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(web_assets)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", bundles, log
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install playwright (the browser comes from apt: chromium)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _public_key_b64(keys: tuple[Path, Path]) -> str:
    from cryptography.hazmat.primitives import serialization

    public = serialization.load_pem_public_key(keys[1].read_bytes())
    return base64.b64encode(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def _open(browser: Any, server: tuple[str, Path, list[str]], bundle: Path, query: str = "") -> dict[str, Any]:
    base, folder, _log = server
    shutil.copyfile(bundle, folder / bundle.name)
    page = browser.new_page()
    try:
        page.goto(f"{base}/index.html?bundle=/bundles/{quote(bundle.name)}{query}")
        page.wait_for_function("window.edgefleet && window.edgefleet.done", timeout=60_000)
        result: dict[str, Any] = page.evaluate("window.edgefleet")
        result["text"] = page.inner_text("#state")
        return result
    finally:
        page.close()


def _golden(bundle: Path, keys: tuple[Path, Path], dest: Path) -> tuple[Manifest, GoldenSet]:
    manifest = unpack_bundle(bundle, dest, TrustedKeys.load([keys[1]]))
    return manifest, GoldenSet.load(dest / manifest.golden.path, manifest.inputs, manifest.outputs)


def _array(tensor: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(tensor["data"]), dtype=tensor["dtype"]).reshape(tensor["shape"])


@pytest.mark.parametrize("variant", ["onnx", "ort"])
def test_the_page_runs_the_golden_set_in_headless_chromium(
    variant: str, web_bundles: dict[str, Path], browser: Any, server: tuple[str, Path, list[str]],
    keys: tuple[Path, Path], tmp_path: Path,
) -> None:  # fmt: skip
    result = _open(browser, server, web_bundles[variant], f"&trust={quote(_public_key_b64(keys))}")
    assert result["state"] == "passed", result["text"]
    assert result["providers"] == ["wasm"] and result["facts"]["format"] == ("ORT" if variant == "ort" else "ONNX")
    manifest, golden = _golden(web_bundles[variant], keys, tmp_path / "b")
    outputs = {name: _array(tensor) for name, tensor in result["outputs"].items()}
    verdict = compare(outputs, golden, manifest.golden)  # the agent's own judgement, on the browser's outputs
    assert verdict.passed, verdict.reason
    assert np.abs(outputs["logits"] - golden.expected["logits"]).max() <= manifest.golden.max_abs_error
    assert result["agreement"] == 1.0


def test_an_oversized_browser_bundle_is_refused_before_download(
    web_bundles: dict[str, Path], browser: Any, server: tuple[str, Path, list[str]], tmp_path: Path,
    keys: tuple[Path, Path], signing_key: SigningKey,
) -> None:  # fmt: skip
    big = padded_bundle(
        web_bundles["onnx"], tmp_path, signing_key, TrustedKeys.load([keys[1]]), version="2", pad_bytes=300_000
    )
    log = server[2]
    result = _open(browser, server, big, "&limit_mb=0.2")
    assert result["state"] == "refused"
    assert re.search(r"bundle is 0\.\d MB; profile browser-wasm allows 0\.2 MB", result["reason"]), result["reason"]
    assert f"HEAD /bundles/{big.name}" in log and f"GET /bundles/{big.name}" not in log


def test_the_page_refuses_bundles_it_must_not_run(
    web_bundles: dict[str, Path], demo_bundles: dict[str, Path], browser: Any, server: tuple[str, Path, list[str]],
    keys: tuple[Path, Path],
) -> None:  # fmt: skip
    other_key = base64.b64encode(bytes(32)).decode()
    untrusted = _open(browser, server, web_bundles["onnx"], f"&trust={quote(other_key)}")
    assert untrusted["state"] == "refused" and "signed by untrusted key" in untrusted["reason"]
    foreign = _open(browser, server, demo_bundles["generic-x86-64"], f"&trust={quote(_public_key_b64(keys))}")
    assert foreign["state"] == "refused"
    assert "built for profile generic-x86-64; this page is browser-wasm" in foreign["reason"]


def test_the_converter_writes_a_browser_bundle_onnxruntime_web_can_read(
    web_bundles: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest, golden = _golden(web_bundles["onnx"], keys, tmp_path / "b")
    assert manifest.web is not None and manifest.web.onnxruntime_web == web.ORT_WEB_VERSION
    assert manifest.providers == ["web:webgpu", "web:wasm"] and manifest.format == "onnx"
    model = onnx.load(str(tmp_path / "b" / manifest.model_path))
    assert model.ir_version <= web.MAX_IR_VERSION and not web.wasm_unsupported(model)
    exported = json.loads((tmp_path / "b" / manifest.web.golden_json).read_text())
    assert exported["count"] == manifest.golden.count == len(exported["inputs"])
    assert exported["max_abs_error"] == manifest.golden.max_abs_error
    np.testing.assert_array_equal(_array(exported["expected"]["logits"]), golden.expected["logits"])
    np.testing.assert_array_equal(_array(exported["inputs"][3]["input"]), golden.inputs.inputs["input"][3])
    ort_manifest, _ = _golden(web_bundles["ort"], keys, tmp_path / "o")
    assert ort_manifest.model_path == "model/model.ort" and ort_manifest.web and ort_manifest.web.ort_format


def test_the_wasm_check_names_what_the_browser_cannot_run() -> None:
    swish = onnx.load(str(DIGITS.parent / "custom_op" / "swish_cnn.onnx"))
    assert "edgefleet.ops::Swish" in web.wasm_unsupported(swish)
    assert web.wasm_unsupported(onnx.load(str(DIGITS / "digits_cnn.onnx"))) == {}
    assert web.wasm_unsupported(onnx.load(str(REPO / "models" / "testbed" / "sklearn_digits.onnx"))) == {}


def test_a_browser_bundle_over_the_profiles_size_limit_is_not_built(tmp_path: Path, signing_key: SigningKey) -> None:
    profile = get_profile("browser-wasm").model_copy(update={"size_limit_mb": 0.01})
    (result,) = convert(
        ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[profile], calib=DIGITS / "calib.npz", eval=DIGITS / "eval.npz",
            out=tmp_path / "out", key=signing_key, name="digits", version="1", report=False,
        )
    )  # fmt: skip
    assert result.bundle is None
    reasons = [str(c["rejected"]) for c in result.candidates]
    assert reasons and all("over the profile's limit 0.01 MB" in r for r in reasons), reasons


def test_the_page_and_the_vendored_assets_match_the_profile_and_the_converter(web_assets: Path) -> None:
    app = (web_assets / "app.mjs").read_text()
    limit = float(re.search(r"export const SIZE_LIMIT_MB = ([\d.]+);", app).group(1))  # type: ignore[union-attr]
    assert limit == get_profile("browser-wasm").size_limit_mb
    package = json.loads((web_assets / "package.json").read_text())
    lock = json.loads((web_assets / "package-lock.json").read_text())
    vendored = json.loads((web_assets / "vendor" / "vendor.json").read_text())
    assert package["dependencies"]["onnxruntime-web"] == web.ORT_WEB_VERSION == vendored["version"]
    assert lock["packages"]["node_modules/onnxruntime-web"]["version"] == web.ORT_WEB_VERSION
    links = re.findall(r'(?:src|href)="([^"]+)"', (web_assets / "index.html").read_text())
    assert links and not [link for link in links if link.startswith(("http:", "https:", "//"))], links  # no CDN
    assert "https://" not in app and "http://" not in app


def test_a_device_agent_refuses_a_browser_bundle_saying_where_it_runs(web_bundles: dict[str, Path]) -> None:
    from edgefleet.agent.install.installer import Refused, check_runnable
    from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest

    manifest = parse_manifest(read_signed_manifest(web_bundles["onnx"]).manifest_json)
    with pytest.raises(Refused, match=r"web:wasm: onnxruntime-web runs in a web browser \(the page in deploy/web\)"):
        check_runnable(manifest)
