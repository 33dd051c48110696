"""Runs gswarm's processes on one host: start in order, restart on crash, stop everything on a signal; with a
GSWARM_HOME, a guardian ends them when this process ends any other way (`guardian`)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import guardian

log = logging.getLogger(__name__)


@dataclass
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path | None  # None: the supervisor's own stdout and stderr (a command run in a terminal)
    ready: Callable[[], bool] | None = None
    stop_signal: int = signal.SIGTERM
    last: bool = False  # stopped after the others (the broker they need to shut down cleanly)


@dataclass
class _Running:
    spec: ProcSpec
    proc: subprocess.Popen[bytes]
    log: IO[bytes] | None
    started: float
    restarts: list[float] = field(default_factory=list)


class Supervisor:
    """Each child runs in its own process group, so the SIGKILL that ends a stop reaches its pool processes too."""

    max_restarts_per_minute = 5

    def __init__(
        self, stop_timeout_s: float = 3.0, last_stop_timeout_s: float = 0.5, records: Path | None = None
    ) -> None:
        # Within 5 s of a stop everything is gone: gunicorn's graceful timeout (2 s) fits the first budget; a worker
        # still busy then is killed and its task redelivered (late acks), as after a crash.
        self.stop_timeout_s = stop_timeout_s
        self.last_stop_timeout_s = last_stop_timeout_s
        self.running: list[_Running] = []
        self.stopping = False
        self.records = records
        self.storage_root: str | None = None
        self._lifeline: int | None = None
        self._guardian: subprocess.Popen[bytes] | None = None
        if records is not None:
            self._start_guardian(records)

    def _start_guardian(self, records: Path) -> None:
        """The guardian holds the read end of a pipe only this process can write to: end of file is our end."""
        read_end, self._lifeline = os.pipe()
        (records.parent / "logs").mkdir(mode=0o700, exist_ok=True)
        self._record()
        logf = open(records.parent / "logs" / "guardian.log", "ab")  # noqa: SIM115
        with logf:
            self._guardian = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gswarm_web.cli.guardian",
                    "--records",
                    str(records),
                    "--fd",
                    str(read_end),
                ],
                pass_fds=(read_end,),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        os.close(read_end)

    def watch_node(self, storage_root: Path) -> None:
        """The node whose model servers end with this supervisor (they outlive a restart of its worker)."""
        self.storage_root = str(storage_root)
        self._record()

    def _record(self) -> None:
        if self.records is None:
            return
        children: list[dict[str, Any]] = []
        for r in self.running:
            try:
                children.append({**guardian.identity(r.proc.pid), "name": r.spec.name, "last": r.spec.last})
            except Exception:  # psutil.NoSuchProcess: it died at once; `check` restarts it and records again
                continue
        me = guardian.identity(os.getpid())
        guardian.write(
            self.records, {"supervisor": me, "storage_root": self.storage_root, "children": children}
        )

    def _popen(self, spec: ProcSpec) -> tuple[subprocess.Popen[bytes], IO[bytes] | None]:
        logf = None
        if spec.log_path is not None:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            logf = open(spec.log_path, "ab")  # noqa: SIM115  (closed in stop())
        proc = subprocess.Popen(
            spec.argv,
            env=spec.env,
            stdout=logf,
            stderr=subprocess.STDOUT if logf else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return proc, logf

    def _spawn(self, spec: ProcSpec) -> subprocess.Popen[bytes]:
        proc, logf = self._popen(spec)
        self.running.append(_Running(spec, proc, logf, time.monotonic()))
        self._record()
        return proc

    def start(self, spec: ProcSpec, ready_timeout_s: float = 60.0) -> None:
        proc = self._spawn(spec)
        if spec.ready is None:
            return
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                where = spec.log_path or "its output above"
                raise RuntimeError(f"{spec.name} exited with {proc.returncode} while starting; see {where}")
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
            if r.log is not None:
                r.log.close()
            r.proc, r.log = self._popen(r.spec)
            self._record()

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
            if r.log is not None:
                r.log.close()

    def stop(self) -> None:
        """Stop every child at once (the broker last): a polite signal, then SIGKILL for what remains."""
        self.stopping = True
        self._stop_group([r for r in self.running if not r.spec.last], self.stop_timeout_s)
        self._stop_group([r for r in self.running if r.spec.last], self.last_stop_timeout_s)
        self.close()

    def close(self) -> None:
        """Drop the records and let the guardian go: nothing is left for it to end."""
        if self.records is not None:
            self.records.unlink(missing_ok=True)
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._guardian is not None:
            try:
                self._guardian.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._guardian.kill()
            self._guardian = None
