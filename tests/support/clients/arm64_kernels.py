"""Which kernels ONNX Runtime runs on the ARM64 device: run inside the arm64 root (tests/e2e/test_arm64_agent.py).

    python arm64_kernels.py MODEL.onnx PROFILE_DIR  ->  one JSON document on stdout

It runs the model once with ONNX Runtime's profiler on and reports every node's operator and execution provider,
with the CPU features the kernel hands this process (edgefleet.core.arm_hwcaps, from the installed wheel): ORT's
MLAS picks its ARM64 integer GEMM kernels by them (asimddp: the sdot/udot kernels, i8mm: smmla/ummla; neither: the
widening NEON multiplies of ARMv8.0).
"""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgefleet.core import arm_hwcaps

TYPES = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8, "tensor(int64)": np.int64}


def main(model: str, profile_dir: str) -> dict[str, object]:
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(profile_dir) / "ort-profile")
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {
        i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], TYPES[i.type]) for i in session.get_inputs()
    }
    session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e["args"] for e in events if e.get("cat") == "Node" and "op_name" in e.get("args", {})]
    features = arm_hwcaps.read()
    return {
        "machine": platform.machine(),
        "onnxruntime": ort.__version__,
        "hwcaps": sorted(features),
        "int8_kernels": "smmla (i8mm)" if "i8mm" in features else "sdot (asimddp)" if "asimddp" in features else "neon",
        "ops": dict(Counter(f"{n['op_name']}@{n['provider']}" for n in nodes)),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
