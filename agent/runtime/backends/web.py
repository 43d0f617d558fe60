"""onnxruntime-web providers (`web:wasm`, `web:webgpu`, `web:webnn`): they run in a web browser, never here.

Browser bundles (profile browser-wasm) are served to a page (deploy/web) that loads them with onnxruntime-web.
This backend exists so that such a bundle sent to a device agent is refused with that reason instead of as an
unknown provider.
"""

from __future__ import annotations

from pathlib import Path

from edgefleet.agent.runtime.backends import (
    Availability,
    Backend,
    CancelToken,
    LoadError,
    LoadOptions,
    Session,
    register,
)

PREFIX = "web:"
BACKENDS = ("wasm", "webgpu", "webnn")
REASON = (
    "onnxruntime-web runs in a web browser (the page in deploy/web), not in the device agent; "
    "serve browser-wasm bundles to that page instead"
)


@register
class WebBackend(Backend):
    key = "onnxruntime-web"
    title = "onnxruntime-web"
    formats = ("onnx",)
    known_providers = tuple(PREFIX + name for name in BACKENDS)

    def claims(self, provider: str) -> bool:
        return provider.startswith(PREFIX)

    def availability(self, provider: str) -> Availability:
        return Availability.no(REASON)

    def version(self, provider: str) -> str:
        return "onnxruntime-web (browser only)"

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        raise LoadError(REASON)
