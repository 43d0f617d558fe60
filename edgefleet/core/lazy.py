"""Names a package exports but imports only when first used (PEP 562), so a process that never uses them never
pays for their imports (the agent's serving process: bench/serve.py's idle RSS)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name in `where` is imported from its module on first use and
    kept in `namespace` (the package's globals), so the next lookup is an ordinary one."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
