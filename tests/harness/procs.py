"""Start and stop real gswarm processes (Celery workers, `gswarm up`) for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and everything it started (none when it is gone already)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `cond` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # the condition may fail until the system is up
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what}"
        + (f" (last error: {last_exc!r})" if last_exc else "")
    )


class Proc:
    """A subprocess in its own process group, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        def seen() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return text in self.log()

        try:
            wait_for(seen, timeout, f"{self.name} to log {text!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.name} log ---\n{self.log()[-3000:]}") from None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.kill_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group(signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self._log.close()


def celery_worker(
    app_module: str,
    queue: str,
    name: str,
    env: dict[str, str],
    log_dir: Path,
    concurrency: int = 2,
    extra: list[str] | None = None,
) -> Proc:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app_module,
        "worker",
        "-Q",
        queue,
        "-n",
        f"{name}@%h",
        "-c",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
        *(extra or []),
    ]
    return Proc(f"worker-{name}", argv, env, log_dir)
