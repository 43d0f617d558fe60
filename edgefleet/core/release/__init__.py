"""Agent releases: the agent's own wheel set for one platform and Python, signed by the release role.

A release file is a tar holding `release.json` (the manifest: version, the requirement pip installs, Python,
platform, every wheel's size and sha256), `release.sig` (a release-role signature over the manifest's exact bytes)
and the wheels under `wheels/`. It travels like a bundle: content-addressed chunks under one signed offer
(`offer.py`); a device installs it into a new environment beside the running one and its launcher
(edgefleet/launcher/) commits it only after the new agent passes its health gate.
"""

from edgefleet.core.release.archive import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    WHEELS_DIR,
    build_release,
    read_release,
    unpack_release,
    verify_release_file,
)
from edgefleet.core.release.manifest import (
    ReleaseError,
    ReleaseFile,
    ReleaseManifest,
    check_platform,
    parse_release_manifest,
    release_id_for,
    this_platform,
    this_python,
    version_key,
)
from edgefleet.core.release.offer import (
    ReleaseRefused,
    check_release_ref,
    release_offer_bytes,
    sign_release_offer,
    transfer_carrier,
    verify_release_offer,
)

__all__ = [
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "WHEELS_DIR",
    "ReleaseError",
    "ReleaseFile",
    "ReleaseManifest",
    "ReleaseRefused",
    "build_release",
    "check_platform",
    "check_release_ref",
    "parse_release_manifest",
    "read_release",
    "release_id_for",
    "release_offer_bytes",
    "sign_release_offer",
    "this_platform",
    "this_python",
    "transfer_carrier",
    "unpack_release",
    "verify_release_file",
    "verify_release_offer",
    "version_key",
]
