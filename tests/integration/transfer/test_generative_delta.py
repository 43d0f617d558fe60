"""A generative bundle is content-addressed like any other: a new version that changes only its tokenizer or its
generation configuration sends only those bytes, the new manifest and signature, and the tar headers between members
(each carries its version's creation time, core/bundle/archive.py) — not the model again."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from edgefleet.control.publish.chunker import describe_chunks
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import bundle_with
from support.models.generative import TinylmBundles

pytestmark = pytest.mark.slow  # the session's tinylm conversion (about a minute)

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
CHUNK = 128 * 1024  # the default message size: what a device fetches per chunk at most


def _member(bundle: Path, name: str) -> bytes:
    with tarfile.open(bundle, "r:") as tar:
        handle = tar.extractfile(name)
        assert handle is not None
        return handle.read()


def _headers(bundle: Path) -> int:
    """Bytes of the bundle that are no member's data: headers (PAX and ustar) and padding."""
    with tarfile.open(bundle, "r:") as tar:
        data = sum(member.size for member in tar)
    return bundle.stat().st_size - data


def _new_bytes(old: Path, new: Path) -> int:
    held = {ref.sha256 for ref in describe_chunks(old, CHUNK)}
    return sum(ref.size for ref in describe_chunks(new, CHUNK) if ref.sha256 not in held)


@pytest.mark.parametrize(
    ("member", "edit"),
    [
        ("model/tokenizer_config.json", lambda d: d | {"chat_template": TEMPLATE}),
        ("model/genai_config.json", lambda d: d | {"search": {**d["search"], "max_length": 128}}),
    ],
    ids=["tokenizer", "generation-config"],
)  # fmt: skip
def test_changing_only_the_tokenizer_or_the_generation_config_sends_only_those_bytes(
    tinylm_bundles: TinylmBundles, tmp_path: Path, signing_key: SigningKey, trusted: TrustedKeys, member: str,
    edit: object,
) -> None:  # fmt: skip
    v1 = tinylm_bundles["generic-x86-64"]
    changed = json.dumps(edit(json.loads(_member(v1, member))), indent=2).encode()  # type: ignore[operator]
    v2 = bundle_with(v1, tmp_path, signing_key, trusted, "2", {member: changed})
    sent = _new_bytes(v1, v2)
    signed = len(_member(v2, "manifest.json")) + len(_member(v2, "signature.json"))
    assert sent <= len(changed) + signed + _headers(v2), (sent, len(changed), signed, _headers(v2))
    assert sent < 0.03 * v2.stat().st_size, (sent, v2.stat().st_size)
