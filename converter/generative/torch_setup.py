"""Importing torch and transformers for the converter: the FP32 reference, the OpenVINO export and the GenAI
builder all load the Hugging Face weights with them.

Before torch's first import, OpenMP is told to wait passively: idle threads that spin take the cores the timed
runtimes need (on a shared 2-core machine, training ran 6x slower with them spinning). Nothing is downloaded:
the hub is off by default, and every load passes local_files_only.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

__all__ = ["import_torch", "offline"]


def offline() -> None:
    """Before anything Hugging Face is imported: the hub is off unless the user's environment says otherwise
    (every load here passes local_files_only anyway)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def import_torch(threads: int) -> ModuleType:
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    offline()
    import torch

    torch.set_num_threads(max(1, threads))
    return torch
