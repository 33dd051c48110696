"""What the gateway measures per replica, kept in Redis (every web process adds to the same counters), and its
Prometheus text for `/metrics`: named as vLLM names its own (`vllm:e2e_request_latency_seconds` is
`gswarm:e2e_request_latency_seconds` here, with vLLM's `model_name` label), per service, replica and node.

One request is one Lua call after its answer went out: its status, its latency, the time it waited for a
replica, and for generations the time to its first token, the time per token after it and the tokens made.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gswarm_tasks import names

from ...extensions import db
from ...tables import Model, Replica, ScalingEvent, Service

KEEP_S = 7 * 24 * 3600
BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
HISTOGRAMS = (
    ("e2e", "gswarm:e2e_request_latency_seconds", "Request latency through the gateway, to the last byte."),
    ("ttft", "gswarm:time_to_first_token_seconds", "Time to the first token of a streamed generation."),
    ("tpot", "gswarm:time_per_output_token_seconds", "Time per output token after the first (streams)."),
    ("queue", "gswarm:request_queue_time_seconds", "Time a request waited in the gateway for a replica."),
)

# KEYS: the replica's stats hash, the live counts, this process's share. ARGV: the replica's live field, then
# (kind, bucket, seconds) triples (bucket -1: not measured), then status, generated and prompt tokens.
DONE = """
redis.call('hincrby', KEYS[2], ARGV[1], -1)
redis.call('hincrby', KEYS[3], ARGV[1], -1)
local n = tonumber(ARGV[2])
for i = 0, n - 1 do
  local kind, bucket, secs = ARGV[3 + 3 * i], ARGV[4 + 3 * i], ARGV[5 + 3 * i]
  if bucket ~= '-1' then
    redis.call('hincrby', KEYS[1], kind .. '|' .. bucket, 1)
    redis.call('hincrby', KEYS[1], kind .. '|n', 1)
    redis.call('hincrbyfloat', KEYS[1], kind .. '|sum', secs)
  end
end
local at = 3 + 3 * n
local status = ARGV[at]
if status == '0' or tonumber(status) >= 500 then redis.call('hincrby', KEYS[1], 'err', 1) end
redis.call('hincrby', KEYS[1], 'n|' .. status, 1)
if ARGV[at + 1] ~= '0' then redis.call('hincrby', KEYS[1], 'gen', ARGV[at + 1]) end
if ARGV[at + 2] ~= '0' then redis.call('hincrby', KEYS[1], 'prompt', ARGV[at + 2]) end
redis.call('expire', KEYS[1], ARGV[at + 3])
return 1
"""


@dataclass
class Outcome:
    """One request as the gateway saw it (status 0: the replica failed before answering)."""

    status: int
    seconds: float
    queue_s: float = 0.0
    ttft_s: float | None = None
    gen_tokens: int = 0
    prompt_tokens: int = 0

    def args(self) -> list[Any]:
        tpot = None
        if self.ttft_s is not None and self.gen_tokens > 1:
            tpot = max(0.0, self.seconds - self.ttft_s) / (self.gen_tokens - 1)
        out: list[Any] = [4]
        for kind, value in (
            ("e2e", self.seconds),
            ("queue", self.queue_s),
            ("ttft", self.ttft_s),
            ("tpot", tpot),
        ):
            if value is None:
                out += [kind, -1, 0]
            else:
                out += [kind, bisect.bisect_left(BUCKETS, value), round(value, 6)]
        return [*out, self.status, self.gen_tokens, self.prompt_tokens, KEEP_S]


def stats_key(replica_id: str) -> str:
    return names.SERVE_STATS_PREFIX + replica_id


def service_key(service_id: str) -> str:
    return f"{names.SERVE_STATS_PREFIX}svc:{service_id}"


def rejected(client: Any, service_id: str, field: str) -> None:
    """A request of the service answered without a replica: `rejected` (503 past the queue's bound) or `timeouts`."""
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(service_key(service_id), field, 1)
    pipe.expire(service_key(service_id), KEEP_S)
    pipe.execute()


# ---- the Prometheus text --------------------------------------------------------------------------------------


def _label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, Any]]) -> str:
    return ",".join(f'{k}="{_label(v)}"' for k, v in pairs)


def _rows() -> list[tuple[Service, str, list[Replica]]]:
    """Services that serve or stopped within the day, with their model names and replicas of the day."""
    since = datetime.now(UTC) - timedelta(days=1)
    services = db.session.execute(
        db.select(Service, Model.name)
        .join(Model, Service.model_id == Model.id)
        .where((Service.status != "stopped") | (Service.stopped_at >= since))
        .order_by(Service.created_at)
    ).all()
    out = []
    for svc, model in services:
        reps = [r for r in svc.members if r.stopped_at is None or r.stopped_at >= since]
        out.append((svc, model, reps))
    return out


def _decode(raw: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in
            raw.items()}  # fmt: skip


def _histogram(lines: list[str], name: str, kind: str, labels: str, stats: dict[str, str]) -> None:
    total = 0
    for i, bound in enumerate(BUCKETS):
        total += int(stats.get(f"{kind}|{i}", 0))
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {total}')
    total += int(stats.get(f"{kind}|{len(BUCKETS)}", 0))
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {total}')
    lines.append(f"{name}_sum{{{labels}}} {float(stats.get(f'{kind}|sum', 0.0))}")
    lines.append(f"{name}_count{{{labels}}} {total}")


def _family(out: dict[str, list[str]], name: str, kind: str, help_: str) -> list[str]:
    if name not in out:
        out[name] = [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    return out[name]


def prometheus_text(client: Any) -> str:
    """The serving series: per replica, per service, and the autoscaler's replica counts and events."""
    rows = _rows()
    live = _decode(client.hgetall(names.SERVE_LIVE_KEY))
    pipe = client.pipeline(transaction=False)
    for svc, _, reps in rows:
        pipe.hgetall(service_key(svc.id))
        for r in reps:
            pipe.hgetall(stats_key(r.id))
    fetched = iter(pipe.execute())
    events = dict(
        ((sid, direction), n)
        for sid, direction, n in db.session.execute(
            db.select(ScalingEvent.service_id, ScalingEvent.direction, db.func.count()).group_by(
                ScalingEvent.service_id, ScalingEvent.direction
            )
        )
    )
    db.session.rollback()
    out: dict[str, list[str]] = {}
    for svc, model, reps in rows:
        base = [("model_name", model), ("service", svc.id)]
        own = _decode(next(fetched))
        _service_series(out, svc, base, own, live, reps, events)
        for r in reps:
            _replica_series(out, _labels([*base, ("replica", r.id), ("node", r.node)]), r, _decode(next(fetched)),
                            live)  # fmt: skip
    lines = [line for family in out.values() for line in family]
    return "\n".join(lines) + "\n" if lines else ""


def _service_series(
    out: dict[str, list[str]],
    svc: Service,
    base: list[tuple[str, Any]],
    own: dict[str, str],
    live: dict[str, str],
    reps: list[Replica],
    events: dict[tuple[str, str], int],
) -> None:
    labels = _labels(base)
    waiting = max(0, int(live.get(f"w:{svc.id}", 0)))
    _family(
        out, "gswarm:num_requests_waiting", "gauge", "Requests waiting in the gateway for a replica."
    ).append(f"gswarm:num_requests_waiting{{{labels}}} {waiting}")
    rejected_ = _family(
        out, "gswarm:requests_rejected_total", "counter", "Requests answered 503 past the queue."
    )
    rejected_.append(
        f'gswarm:requests_rejected_total{{{labels},reason="queue_full"}} {int(own.get("rejected", 0))}'
    )
    rejected_.append(
        f'gswarm:requests_rejected_total{{{labels},reason="timeout"}} {int(own.get("timeouts", 0))}'
    )
    states = {"desired": svc.replicas, "running": 0, "starting": 0, "draining": 0}
    for r in reps:
        if r.status == "running":
            states["running"] += 1
        elif r.status in ("pending", "placing", "starting"):
            states["starting"] += 1
        elif r.status == "draining":
            states["draining"] += 1
    family = _family(
        out, "gswarm:replicas", "gauge", "Replicas of a service by state (desired: the count kept)."
    )
    family += [f'gswarm:replicas{{{labels},state="{k}"}} {v}' for k, v in states.items()]
    policy = svc.autoscaling or {}
    if policy:
        limits = _family(
            out, "gswarm:replicas_limit", "gauge", "The autoscaler's bounds (min_replicas, max)."
        )
        limits.append(f'gswarm:replicas_limit{{{labels},bound="min"}} {policy.get("min_replicas", 0)}')
        limits.append(f'gswarm:replicas_limit{{{labels},bound="max"}} {policy.get("max_replicas", 0)}')
    scaled = _family(
        out, "gswarm:scaling_events_total", "counter", "Replica count changes by the autoscaler."
    )
    for direction in ("up", "down"):
        scaled.append(f'gswarm:scaling_events_total{{{labels},direction="{direction}"}} '
                      f"{events.get((svc.id, direction), 0)}")  # fmt: skip


def _replica_series(
    out: dict[str, list[str]], labels: str, r: Replica, stats: dict[str, str], live: dict
) -> None:
    _family(
        out,
        "gswarm:num_requests_running",
        "gauge",
        "Requests in flight at a replica, over every web process.",
    )
    out["gswarm:num_requests_running"].append(
        f"gswarm:num_requests_running{{{labels}}} {max(0, int(live.get(f'r:{r.id}', 0)))}"
    )
    codes = {k[2:]: int(v) for k, v in stats.items() if k.startswith("n|")} or {
        "200": 0
    }  # a series from the start
    total = _family(
        out, "gswarm:requests_total", "counter", "Requests a replica answered, by HTTP status (0: none)."
    )
    total += [f'gswarm:requests_total{{{labels},code="{c}"}} {n}' for c, n in sorted(codes.items())]
    ok = sum(n for c, n in codes.items() if c.startswith("2"))
    _family(out, "gswarm:request_success_total", "counter", "Requests a replica answered with 2xx.").append(
        f"gswarm:request_success_total{{{labels}}} {ok}"
    )
    errors = _family(
        out, "gswarm:request_errors_total", "counter", "Requests failed at a replica (5xx, no answer)."
    )
    errors.append(f"gswarm:request_errors_total{{{labels}}} {int(stats.get('err', 0))}")
    for field, name, help_ in (("gen", "gswarm:generation_tokens_total", "Generation tokens made."),
                               ("prompt", "gswarm:prompt_tokens_total", "Prompt tokens read.")):  # fmt: skip
        _family(out, name, "counter", help_).append(f"{name}{{{labels}}} {int(stats.get(field, 0))}")
    for kind, name, help_ in HISTOGRAMS:
        _histogram(_family(out, name, "histogram", help_), name, kind, labels, stats)
