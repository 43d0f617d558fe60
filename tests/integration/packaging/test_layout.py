"""Package boundaries: the device side stays light and never reaches into the host side."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

HOST_ONLY = ("edgefleet.converter", "edgefleet.control", "converter", "onnx", "openvino", "amqtt", "rich", "torch")


def _imports(directory: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in directory.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        found[str(path.relative_to(REPO))] = names
    return found


def _offending(names: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def test_agent_source_never_imports_the_converter_or_host_packages() -> None:
    bad = {f: _offending(n, HOST_ONLY) for f, n in _imports(REPO / "agent").items()}
    assert not {f: n for f, n in bad.items() if n}


def test_core_imports_neither_side() -> None:
    sides = ("edgefleet.agent", "edgefleet.converter", "edgefleet.control", "edgefleet.cli")
    bad = {f: _offending(n, sides) for f, n in _imports(REPO / "edgefleet" / "core").items()}
    assert not {f: n for f, n in bad.items() if n}


def test_running_the_agent_command_loads_no_host_module() -> None:
    """What `edgefleet agent` really imports (the CLI included), checked in a fresh interpreter."""
    code = (
        "import sys, json; import edgefleet.cli.main, edgefleet.agent.daemon.supervisor; "
        "print(json.dumps(sorted(m for m in sys.modules)))"
    )
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True))
    assert _offending(set(loaded), HOST_ONLY) == []
