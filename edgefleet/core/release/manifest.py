"""The manifest of an agent release: what it installs, for which Python and platform, and every file's pin."""

from __future__ import annotations

import platform
import re
import sys

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgefleet.core.errors import BundleError

_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")
_WHEEL = r"^[A-Za-z0-9_.+-]+\.whl$"


class ReleaseError(BundleError):
    """A release file or manifest that is malformed, unsigned or does not match its pins."""


class ReleaseFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=_WHEEL, max_length=255, description="a wheel's file name (no directory)")
    size: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ReleaseManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = 1
    release_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    version: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$", max_length=64, description="the agent's version")
    requirement: str = Field(
        pattern=r"^edgefleet(\[[a-z0-9,-]+\])?$", description="what pip installs from the wheels (extras included)"
    )
    python: str = Field(pattern=r"^3\.[0-9]{1,2}$", description="the Python (major.minor) the wheels are for")
    platform: str = Field(pattern=r"^[a-z0-9_]+-[A-Za-z0-9_]+$", description="sys.platform-machine, e.g. linux-x86_64")
    files: list[ReleaseFile] = Field(min_length=1, max_length=512)
    created_at: float = 0.0

    def file(self, name: str) -> ReleaseFile | None:
        return next((f for f in self.files if f.name == name), None)

    @property
    def install_spec(self) -> str:
        """The pip requirement that installs exactly this release's agent."""
        return f"{self.requirement}=={self.version}"


def parse_release_manifest(text: str) -> ReleaseManifest:
    try:
        manifest = ReleaseManifest.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "manifest"
        raise ReleaseError(f"release manifest is malformed: {first['msg']} at {where}") from err
    names = [f.name for f in manifest.files]
    if len(set(names)) != len(names):
        raise ReleaseError("release manifest lists a wheel twice")
    if not any(n.startswith(f"edgefleet-{manifest.version}-") for n in names):
        raise ReleaseError(f"release manifest holds no edgefleet {manifest.version} wheel")
    return manifest


def version_key(version: str) -> tuple[int, ...]:
    """Agent versions are dotted integers, so "only goes up" is well defined (as for model versions)."""
    if not _VERSION.match(version):
        raise ValueError(f"invalid agent version {version!r}: use dotted integers such as 0.1.1")
    return tuple(int(part) for part in version.split("."))


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def this_platform() -> str:
    return f"{sys.platform}-{platform.machine()}"


def release_id_for(version: str, python: str, platform_tag: str) -> str:
    return f"agent-{version}-py{python.replace('.', '')}-{platform_tag}"


def check_platform(manifest: ReleaseManifest) -> None:
    """ReleaseError unless this interpreter and machine are the release's."""
    if manifest.python != this_python() or manifest.platform != this_platform():
        raise ReleaseError(
            f"release {manifest.release_id} is for Python {manifest.python} on {manifest.platform}; this device runs "
            f"Python {this_python()} on {this_platform()}"
        )


__all__ = [
    "ReleaseError",
    "ReleaseFile",
    "ReleaseManifest",
    "check_platform",
    "parse_release_manifest",
    "release_id_for",
    "this_platform",
    "this_python",
    "version_key",
]
