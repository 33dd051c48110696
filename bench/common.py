"""Helpers the benchmarks share."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process and all its children (a Celery worker and its pool)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class Row:
    """One figure of a benchmark: every run's value, its unit and goal; printed as one line with the median, the
    spread (min-max) and the load average at the time (`make bench` shows one such line per figure)."""

    name: str
    values: list[float]
    unit: str
    goal: str  # as printed, e.g. "< 25"; "info" for a figure without a goal
    check: Callable[[float], bool] | None  # the goal, applied to the median

    def median(self) -> float:
        return float(statistics.median(self.values))

    def ok(self) -> bool:
        return self.check is None or self.check(self.median())

    def line(self) -> str:
        verdict = "INFO" if self.check is None else ("PASS" if self.ok() else "MISS")
        lo, hi = min(self.values), max(self.values)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        goal = "" if self.check is None else f" (goal {self.goal} {self.unit})"
        return (
            f"{verdict} {self.name}: median {_num(self.median())} {self.unit} [{_num(lo)}-{_num(hi)}]"
            f" over {len(self.values)} runs{goal}; load {load}"
        )


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


class Profiles:
    """py-spy attached to running processes while a benchmark case runs (`--profile DIR`): one file per case
    and process, a flame graph (`.svg`) or collapsed stacks (`.txt`, `--profile-format raw`)."""

    def __init__(self, out_dir: str | None, fmt: str = "flamegraph", rate: int = 40) -> None:
        self.out_dir = out_dir
        self.fmt = fmt
        self.rate = rate

    @contextlib.contextmanager
    def record(self, case: str, pids: dict[str, int]) -> Iterator[None]:
        if not self.out_dir:
            yield
            return
        os.makedirs(self.out_dir, exist_ok=True)
        ext = "svg" if self.fmt == "flamegraph" else "txt"
        spies = []
        for name, pid in pids.items():
            out = os.path.join(self.out_dir, f"{case}-{name}.{ext}")
            argv = [
                os.path.join(os.path.dirname(sys.executable), "py-spy"),
                "record",
                "--pid",
                str(pid),
                "-r",
                str(self.rate),
                "--nonblocking",
            ]
            if name != "web":  # a worker's pool processes are its children; the web's children are the fleet
                argv.append("--subprocesses")
            argv += ["--format", self.fmt, "-o", out]
            spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attaches before the case starts
        try:
            yield
        finally:
            for p in spies:
                p.send_signal(signal.SIGINT)
            for p in spies:
                p.wait(timeout=60)


def up_web_argv(settings: Any, env: dict[str, str], port: int) -> list[str]:
    """The API's command line exactly as `gswarm up` builds it (gunicorn, its worker model), on 127.0.0.1:`port`."""
    from gswarm_web.cli.up import control_plane_specs

    web = next(s for s in control_plane_specs(settings, env, "127.0.0.1", port) if s.name == "web")
    return list(web.argv)
