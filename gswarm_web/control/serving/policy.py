"""An autoscaled service's policy and the autoscaler's decision, as pure functions of what it sampled.

A service may set `min_replicas`, `max_replicas` and one target: `target_in_flight` (requests in flight per
replica, counted over every web process, the requests waiting in the gateway's queue included),
`target_queue_wait_s` (the mean time requests waited in the gateway's queue for a replica) or
`target_engine_waiting` (requests waiting in the engines' own queues per replica: vLLM's
`vllm:num_requests_waiting`, SGLang's `sglang:num_queue_reqs`, llama.cpp's `llamacpp:requests_deferred`; where no
replica reports one, the gateway's queue stands in). Replicas are added
once every sample of the last `scale_up_delay_s` asked for more (to the fewest any of them asked for), and removed
once every sample of the last `scale_down_delay_s` asked for fewer (to the most any of them asked for); a request
waiting for a service at zero starts one at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gswarm_tasks.errors import InvalidRequest

TARGETS = ("target_in_flight", "target_queue_wait_s", "target_engine_waiting")
KEYS = ("min_replicas", "max_replicas", *TARGETS, "scale_up_delay_s", "scale_down_delay_s")
DEFAULT_TARGET_IN_FLIGHT = 4.0
MOST_REPLICAS = 64


@dataclass(frozen=True)
class Policy:
    """What a service asked of the autoscaler (defaults filled in)."""

    min_replicas: int
    max_replicas: int
    target_in_flight: float | None
    target_queue_wait_s: float | None
    scale_up_delay_s: float
    scale_down_delay_s: float
    target_engine_waiting: float | None = None

    def doc(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Sample:
    """The load of a service at one tick: requests in flight at its replicas, waiting in the queue, the mean queue
    wait of the requests that were served since the previous tick (None: none was), and the requests waiting in its
    replicas' engines' own queues (None: no replica reports one)."""

    at: float
    in_flight: int
    waiting: int
    queue_wait_s: float | None = None
    engine_waiting: float | None = None


def _number(
    doc: Mapping[str, Any], key: str, where: str, low: float, high: float, integer: bool = False
) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        what = "an integer" if integer else "a number"
        raise InvalidRequest(f"{where}.{key}: {what} from {low:g} to {high:g}", {"field": f"{where}.{key}"})
    return value


def parse(doc: Any, up_delay_s: float, down_delay_s: float, where: str = "autoscaling") -> Policy:
    """The policy of `doc` (422 naming the field for anything else), with the settings' delays by default."""
    if not isinstance(doc, Mapping):
        raise InvalidRequest(f"{where}: an object ({', '.join(KEYS)})", {"field": where})
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise InvalidRequest(
            f"{where}.{unknown[0]}: not one of {', '.join(KEYS)}", {"field": f"{where}.{unknown[0]}"}
        )
    low = _number(doc, "min_replicas", where, 0, MOST_REPLICAS, integer=True)
    high = _number(doc, "max_replicas", where, 1, MOST_REPLICAS, integer=True)
    low = 1 if low is None else low
    high = max(low, 1) if high is None else high
    if low > high:
        field = f"{where}.min_replicas"
        raise InvalidRequest(f"{field}: {low} is above max_replicas {high}", {"field": field})
    in_flight = _number(doc, "target_in_flight", where, 0.01, 1e6)
    wait = _number(doc, "target_queue_wait_s", where, 0.001, 3600)
    engine = _number(doc, "target_engine_waiting", where, 0.01, 1e6)
    given = [k for k, v in zip(TARGETS, (in_flight, wait, engine), strict=True) if v is not None]
    if len(given) > 1:
        raise InvalidRequest(
            f"{where}.{given[1]}: one target, {', '.join(TARGETS[:-1])} or {TARGETS[-1]}",
            {"field": f"{where}.{given[1]}"},
        )
    up = _number(doc, "scale_up_delay_s", where, 0, 3600)
    down = _number(doc, "scale_down_delay_s", where, 0, 86400)
    return Policy(
        low,
        high,
        float(in_flight) if in_flight is not None else (None if given else DEFAULT_TARGET_IN_FLIGHT),
        float(wait) if wait is not None else None,
        float(up_delay_s if up is None else up),
        float(down_delay_s if down is None else down),
        float(engine) if engine is not None else None,
    )


def wanted(policy: Policy, current: int, s: Sample) -> int:
    """The replica count one sample asks for, within the policy's bounds."""
    if policy.target_in_flight is not None:
        want = math.ceil((s.in_flight + s.waiting) / policy.target_in_flight - 1e-9)
    elif policy.target_engine_waiting is not None:
        want = _for_engine_queue(policy.target_engine_waiting, current, s)
    elif s.queue_wait_s is not None and s.queue_wait_s > policy.target_queue_wait_s:  # type: ignore[operator]
        want = max(current + 1, math.ceil(current * s.queue_wait_s / policy.target_queue_wait_s))  # type: ignore
    elif s.waiting or (s.queue_wait_s or 0.0) > policy.target_queue_wait_s / 4:  # type: ignore[operator]
        want = max(current, 1)  # close to the target: stay
    elif current > 1:
        want = current - 1
    else:
        want = 1 if s.in_flight else 0
    if s.waiting and want < 1:
        want = 1  # a request waits: never none
    return max(policy.min_replicas, min(policy.max_replicas, want))


def _for_engine_queue(target: float, current: int, s: Sample) -> int:
    """Replicas for a target of requests waiting in each engine's own queue: above it, enough replicas to bring the
    mean to it (one more at least); some waiting, stay; none waiting anywhere, one fewer (the scale-down delay
    keeps a service from shrinking while its load holds)."""
    queued = s.engine_waiting if s.engine_waiting is not None else float(s.waiting)
    if current == 0:
        return 1 if (s.waiting or s.in_flight) else 0
    if queued / current > target:
        return max(current + 1, math.ceil(queued / target - 1e-9))
    if queued or s.waiting:
        return current
    return current - 1 if current > 1 else (1 if s.in_flight else 0)


def decide(policy: Policy, current: int, samples: Sequence[Sample], now: float) -> tuple[int, str] | None:
    """(the new replica count, why), or None to stay. `samples` are oldest first, taken since the last change."""
    if not samples:
        return None
    if current < policy.min_replicas or current > policy.max_replicas:
        target = max(policy.min_replicas, min(policy.max_replicas, current))
        return (
            target,
            f"kept within min_replicas {policy.min_replicas} and max_replicas {policy.max_replicas}",
        )
    last = samples[-1]
    if current == 0 and last.waiting:
        return max(1, wanted(policy, current, last)), f"from zero: {last.waiting} request(s) waiting"
    up = _window(samples, now, policy.scale_up_delay_s)
    if up:
        asks = [wanted(policy, current, s) for s in up]
        if min(asks) > current:
            return min(asks), f"load above target for {policy.scale_up_delay_s:g} s ({_load(policy, up)})"
    down = _window(samples, now, policy.scale_down_delay_s)
    if down:
        asks = [wanted(policy, current, s) for s in down]
        if max(asks) < current:
            return max(asks), f"load below target for {policy.scale_down_delay_s:g} s ({_load(policy, down)})"
    return None


def _window(samples: Sequence[Sample], now: float, delay_s: float) -> list[Sample]:
    """The samples of the last `delay_s`, when the history covers all of it (else none: too early to say)."""
    if samples[0].at > now - delay_s + 1e-6 and delay_s > 0:
        return []
    return [s for s in samples if s.at >= now - delay_s - 1e-6] or [samples[-1]]


def _load(policy: Policy, window: Sequence[Sample]) -> str:
    if policy.target_in_flight is not None:
        mean = sum(s.in_flight + s.waiting for s in window) / len(window)
        return f"mean {mean:.1f} in flight or waiting, target {policy.target_in_flight:g} per replica"
    if policy.target_engine_waiting is not None:
        queued = [s.engine_waiting if s.engine_waiting is not None else float(s.waiting) for s in window]
        mean = sum(queued) / len(queued)
        return f"mean {mean:.1f} waiting in the engines' queues, target {policy.target_engine_waiting:g} per replica"
    waits = [s.queue_wait_s for s in window if s.queue_wait_s is not None]
    mean_wait = sum(waits) / len(waits) if waits else 0.0
    return f"mean queue wait {mean_wait:.3f} s, target {policy.target_queue_wait_s:g} s"
