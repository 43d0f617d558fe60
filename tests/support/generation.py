"""Generation under test: raw HTTP exchanges with the generate and OpenAI endpoints (server-sent events read back),
a session that slows a real runtime down (so that drains and cut streams can be timed), and a generative bundle whose
weights were damaged after conversion but signed anyway (what a broken build would ship)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.agent.runtime.generative.session import (
    GenerationRequest,
    GenerationResult,
    GenerativeSession,
    OnText,
    Stopper,
)
from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.trust.signing import SigningKey, TrustedKeys


def post(port: int, path: str, document: Any, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(document), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def sse_events(body: bytes) -> list[Any]:
    """The `data:` payloads of a text/event-stream body, decoded (`[DONE]` kept as the string)."""
    events = []
    for block in body.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: ") and "\n" not in block, f"not one data line: {block!r}"
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def weights_file(manifest: Manifest) -> str:
    """The bundle path of a generative bundle's largest file: its weights."""
    assert manifest.generation is not None
    inside = [e for e in manifest.files if e.path.startswith(manifest.generation.model_dir + "/")]
    return max(inside, key=lambda e: e.size).path


def scramble(path: Path, share: float = 0.5, seed: int = 0) -> None:
    """Overwrite the middle `share` of a weights file with noise: the model still loads and answers garbage."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * (1 - share) / 2)
    end = start + int(len(data) * share) // 4 * 4
    noise = np.random.default_rng(seed).normal(0, 0.5, (end - start) // 4).astype(np.float32).tobytes()
    data[start:end] = noise
    path.write_bytes(bytes(data))


def corrupted_bundle(source: Path, out_dir: Path, key: SigningKey, trusted: TrustedKeys, version: str) -> Path:
    """A re-signed copy of a generative bundle whose weights were damaged: the signature and hashes hold, the golden
    prompts must catch it."""
    unpacked = out_dir / f"corrupted-{version}"
    manifest = unpack_bundle(source, unpacked, trusted)
    scramble(unpacked / weights_file(manifest))
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    updated = manifest.model_copy(update={
        "model_version": version, "bundle_id": f"{manifest.bundle_id}-corrupted{version}",
        "files": describe_files(sources),
    })  # fmt: skip
    path = out_dir / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return path


class SlowSession(GenerativeSession):
    """A real session whose text pieces each take `delay_s` longer: a stream that lasts long enough to be cut or
    drained. `started` is set when the first piece came."""

    def __init__(self, inner: GenerativeSession, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s = inner, delay_s
        self.provider = inner.provider
        self.started = threading.Event()

    def generate(self, request: GenerationRequest, on_text: OnText, stopper: Stopper | None = None) -> GenerationResult:
        def slow(piece: str) -> None:
            self.started.set()
            time.sleep(self.delay_s)
            on_text(piece)

        return self.inner.generate(request, slow, stopper)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        return self.inner.logits(ids)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> str | None:
        return self.inner.apply_chat_template(messages)
