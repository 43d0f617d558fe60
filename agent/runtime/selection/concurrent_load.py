"""The CPU EP candidate loaded in the agent while the measuring worker goes on measuring the others.

The worker measures every candidate side by side; the agent then loads the winner itself and checks it against the
golden set again. When the winner is ONNX Runtime's CPU EP (the runtime the agent has imported anyway, so loading
it here leaves nothing new behind), that load need not wait: it starts as soon as the worker reports that the CPU
EP loaded and passed the golden set (so a load that crashes or hangs was met in the worker first), and runs while
the worker loads and times the rest. A session loaded early and not chosen is closed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from edgefleet.agent.runtime.selection.trial import Trial

EARLY_PROVIDERS = ("CPUExecutionProvider",)


class EarlyLoads:
    """In-agent loads started while a worker measures; `finish` waits for them (each is time-bounded)."""

    def __init__(self, load: Callable[[str], Trial]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._trials: dict[str, Trial] = {}

    def passed_in_worker(self, provider: str) -> None:
        """The worker loaded `provider` and it passed the golden set there: load it here too, on a thread."""
        with self._lock:
            if provider not in EARLY_PROVIDERS or provider in self._threads:
                return
            thread = threading.Thread(target=self._run, args=(provider,), name=f"early load {provider}", daemon=True)
            self._threads[provider] = thread
        thread.start()

    def _run(self, provider: str) -> None:
        trial = self._load(provider)
        with self._lock:
            self._trials[provider] = trial

    def finish(self) -> dict[str, Trial]:
        """The early trials that loaded and passed the golden set in the agent; the others are closed."""
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join()
        kept: dict[str, Trial] = {}
        with self._lock:
            for provider, trial in self._trials.items():
                verdict = trial.measurement.golden
                if trial.session is not None and verdict is not None and verdict.passed:
                    kept[provider] = trial
                elif trial.session is not None:
                    trial.session.close()
        return kept

    def discard(self) -> None:
        for trial in self.finish().values():
            if trial.session is not None:
                trial.session.close()
