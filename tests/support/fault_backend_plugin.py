"""A backend plugin (loaded through $EDGEFLEET_BACKENDS, so a measuring worker process has it too) that wraps a
real ONNX Runtime session and adds the one fault named in $EDGEFLEET_FAULT, which a real runtime cannot be made to
produce on demand: `hang` (a load stuck in native code), `crash` (a load that takes its process down, as a
segfault would) or `slow` (every run busy for the milliseconds the file $EDGEFLEET_FAULT_DELAY_FILE holds when the
bundle loads: a device on which the bundle runs slower than its build). Provider name: "plugin-fault:A"."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `support` in a measuring worker

from edgefleet.agent.runtime.backends import CancelToken, LoadOptions, Session, register

from support.runtime import FaultBackend


@register
class PluginFaultBackend(FaultBackend):
    key = "plugin-fault"
    known_providers = ("plugin-fault:A",)

    def __init__(self) -> None:
        super().__init__("plugin-fault")

    def load(self, model_path: Path, provider: str, options: LoadOptions, cancel: CancelToken) -> Session:
        fault = os.environ.get("EDGEFLEET_FAULT", "")
        if fault == "hang":
            time.sleep(3600)  # holds no cancellation: only killing its process ends it
        if fault == "crash":
            os._exit(139)
        if fault == "slow":
            self.run_delay_s = float(Path(os.environ["EDGEFLEET_FAULT_DELAY_FILE"]).read_text()) / 1000
        return super().load(model_path, provider, options, cancel)
