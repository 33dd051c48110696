"""Runs gswarm's processes on one host: start in order, restart on crash, stop everything on a signal."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


@dataclass
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[], bool] | None = None
    stop_signal: int = signal.SIGTERM
    last: bool = False  # stopped after the others (the broker they need to shut down cleanly)


@dataclass
class _Running:
    spec: ProcSpec
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float
    restarts: list[float] = field(default_factory=list)


class Supervisor:
    """Each child runs in its own process group, so the SIGKILL that ends a stop reaches its pool processes too."""

    max_restarts_per_minute = 5

    def __init__(self, stop_timeout_s: float = 3.0, last_stop_timeout_s: float = 0.5) -> None:
        # Within 5 s of a stop everything is gone: gunicorn's graceful timeout (2 s) fits the first budget; a worker
        # still busy then is killed and its task redelivered (late acks), as after a crash.
        self.stop_timeout_s = stop_timeout_s
        self.last_stop_timeout_s = last_stop_timeout_s
        self.running: list[_Running] = []
        self.stopping = False

    def _spawn(self, spec: ProcSpec) -> subprocess.Popen[bytes]:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(spec.log_path, "ab")  # noqa: SIM115  (closed in stop())
        proc = subprocess.Popen(
            spec.argv,
            env=spec.env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.running.append(_Running(spec, proc, logf, time.monotonic()))
        return proc

    def start(self, spec: ProcSpec, ready_timeout_s: float = 60.0) -> None:
        proc = self._spawn(spec)
        if spec.ready is None:
            return
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{spec.name} exited with {proc.returncode} while starting; see {spec.log_path}")
            if spec.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{spec.name} was not ready within {ready_timeout_s:.0f} s; see {spec.log_path}")

    def check(self) -> None:
        """Restart children that died; give up (raise) on one that keeps dying."""
        if self.stopping:
            return
        for r in self.running:
            code = r.proc.poll()
            if code is None:
                continue
            now = time.monotonic()
            r.restarts = [t for t in r.restarts if now - t < 60] + [now]
            if len(r.restarts) > self.max_restarts_per_minute:
                raise RuntimeError(f"{r.spec.name} keeps exiting (last code {code}); see {r.spec.log_path}")
            log.warning("%s exited with %s; restarting", r.spec.name, code)
            r.log.close()
            logf = open(r.spec.log_path, "ab")  # noqa: SIM115
            r.proc = subprocess.Popen(
                r.spec.argv,
                env=r.spec.env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            r.log = logf

    def _signal_group(self, r: _Running, sig: int) -> None:
        try:
            os.killpg(r.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_group(self, group: list[_Running], timeout_s: float) -> None:
        for r in group:
            # The polite signal goes to the leader alone: a Celery worker or gunicorn master then stops its own
            # pool (a pool process sent SIGTERM as well dies mid-task, is replaced, and holds up the shutdown).
            if r.proc.poll() is None:
                r.proc.send_signal(r.spec.stop_signal)
        deadline = time.monotonic() + timeout_s
        while any(r.proc.poll() is None for r in group) and time.monotonic() < deadline:
            time.sleep(0.05)
        for r in group:
            # The leader may be gone while its pool children linger: the group kill reaches them.
            self._signal_group(r, signal.SIGKILL)
            if r.proc.poll() is None:
                r.proc.wait(timeout=5)
            r.log.close()

    def stop(self) -> None:
        """Stop every child at once (the broker last): a polite signal, then SIGKILL for what remains."""
        self.stopping = True
        self._stop_group([r for r in self.running if not r.spec.last], self.stop_timeout_s)
        self._stop_group([r for r in self.running if r.spec.last], self.last_stop_timeout_s)
