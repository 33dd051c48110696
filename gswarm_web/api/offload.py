"""CPU-heavy work off the request loop: under gunicorn's gevent workers every request of a process shares one OS
thread, so a 5 s simulation stalled that process's health checks and gateway requests. `offload(fn, ...)` runs a
pure function (no app context: it gets plain values) on a thread of gevent's pool, where the interpreter switches
back to the loop every few milliseconds, and at most HEAVY_AT_ONCE at a time per process; more wait their turn,
up to WAIT_S, then get 503 with Retry-After. Without gevent it runs the function where it is."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from gswarm_tasks.errors import GswarmError

T = TypeVar("T")

HEAVY_AT_ONCE = 2
WAIT_S = 30.0
_slots = threading.BoundedSemaphore(HEAVY_AT_ONCE)


class Busy(GswarmError):
    code = "RESOURCE_UNAVAILABLE"
    status = 503


def _cooperative() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("threading"))


def offload(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on a worker thread (under gevent), a few at a time per process."""
    if not _slots.acquire(timeout=WAIT_S):
        raise Busy(
            f"{HEAVY_AT_ONCE} heavy requests are running in this process; retry shortly", {"retry_after_s": 5}
        )
    try:
        if not _cooperative():
            return fn(*args)
        import gevent

        return gevent.get_hub().threadpool.apply(fn, args)
    finally:
        _slots.release()
