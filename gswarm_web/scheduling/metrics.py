"""The summary of a schedule, computed from its executions alone (so the validator can recompute it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks, as numpy's default."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latencies(executions: Sequence[Mapping[str, Any]], arrivals: Mapping[str, float]) -> list[float]:
    """Per request: the end of its last step minus its arrival (requests with no executions are left out)."""
    last: dict[str, float] = {}
    for e in executions:
        rid = e["request_id"]
        last[rid] = max(last.get(rid, 0.0), e["end_time"])
    return [end - arrivals.get(rid, 0.0) for rid, end in last.items()]


def summarize(
    executions: Sequence[Mapping[str, Any]], arrivals: Mapping[str, float], policy: str, mode: str
) -> dict[str, Any]:
    """Makespan, loads (one per GPU a model is loaded onto, the first load on an empty GPU included), seconds of
    loading (GPU-seconds: a load onto two GPUs counts twice), request latency p50/p99, and the step count."""
    lats = latencies(executions, arrivals)
    cold = [e for e in executions if e["loaded_from"] != "gpu"]
    return {
        "policy": policy,
        "mode": mode,
        "makespan": max((e["end_time"] for e in executions), default=0.0),
        "model_loads": sum(len(e["gpus"]) for e in cold),
        "load_seconds": sum(e["switch_time"] * len(e["gpus"]) for e in cold),
        "request_latency_p50": percentile(lats, 50),
        "request_latency_p99": percentile(lats, 99),
        "steps": len(executions),
    }
