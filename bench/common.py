"""Helpers the benchmarks share."""

from __future__ import annotations

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
