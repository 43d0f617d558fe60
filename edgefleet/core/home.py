"""Where edgefleet keeps a user's keys, caches and stores: $EDGEFLEET_HOME, else ~/.edgefleet."""

from __future__ import annotations

import os
from pathlib import Path


def edgefleet_home() -> Path:
    return Path(os.environ.get("EDGEFLEET_HOME", Path.home() / ".edgefleet"))


def keys_dir() -> Path:
    """The host's key directory: root (keep it offline), bundle and ops keys, and the signed key set."""
    return edgefleet_home() / "keys"
