"""Test and bench helper: `edgefleet control serve` as a real process (started, killed with SIGKILL, restarted)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from support.paths import REPO

LAUNCH = "import sys; from edgefleet.cli import main\nsys.exit(main.main(sys.argv[1:]))"


class ServeProcess:
    """One control-plane instance. Its output goes to `log_path` (shown when it fails to start)."""

    def __init__(self, broker: str, store_url: str, instance: str, log_dir: Path, *extra: str) -> None:
        self.broker, self.store_url, self.instance, self.extra = broker, store_url, instance, extra
        self.log_path = log_dir / f"serve-{instance}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout: float = 60.0) -> ServeProcess:
        """Start and wait for the line it prints once it is connected and serving."""
        cmd = [sys.executable, "-c", LAUNCH, "control", "serve", "--broker", self.broker, "--store", self.store_url,
               "--instance", self.instance, "--http", "off", *self.extra]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log_path.open("ab") as out:
            mark = out.tell()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while f"control plane {self.instance} on" not in self.log()[mark:]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"control serve {self.instance} did not start:\n{self.log()[mark:]}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: a crash; nothing is flushed, released or said goodbye to."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def pause(self) -> None:
        """SIGSTOP: the process stalls (a long GC pause, a VM frozen) with all its state and connections."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 30.0) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)  # a paused process would never see the SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServeProcess:
        return self.start() if not self.running else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
