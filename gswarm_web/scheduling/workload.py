"""The request trace in the original's YAML format, and the steps it makes: one per workflow node per request."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .config import Config, ModelSpec
from .fields import mapping, number, refuse, sequence, text

MODES = ("online", "offline")


@dataclass(frozen=True)
class RequestSpec:
    """One request: its workflow, arrival in seconds from the first request, and each node's execution time."""

    request_id: str
    workflow_id: str
    arrival: float
    seconds: tuple[float, ...]  # aligned with the workflow's node order


def _instant(value: Any, field: str) -> float:
    """A timestamp as seconds: ISO 8601 text, a datetime (YAML reads unquoted ones so), or a number of seconds."""
    if isinstance(value, bool):
        raise refuse(field, "must be an ISO 8601 timestamp or a number of seconds")
    if isinstance(value, int | float):
        return number(value, field)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise refuse(field, f"{value!r} is not an ISO 8601 timestamp", value) from exc
    if not isinstance(value, datetime):
        raise refuse(field, "must be an ISO 8601 timestamp or a number of seconds")
    # Naive timestamps are read as UTC so that a trace mixing both forms still orders correctly.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _seconds(req: dict[str, Any], config: Config, wid: str, field: str) -> tuple[float, ...]:
    wf = config.workflows[wid]
    given = mapping(req.get("node_execution_times") or {}, f"{field}.node_execution_times")
    node_configs = mapping(req.get("node_configs") or {}, f"{field}.node_configs")
    out: list[float] = []
    for nid, model in zip(wf.node_ids, wf.models, strict=True):
        nf = f"{field}.node_execution_times.{nid}"
        if nid in given:
            out.append(number(given[nid], nf))
            continue
        derived = config.models[model].derived_seconds(
            mapping(node_configs.get(nid) or {}, f"{field}.node_configs")
        )
        if derived is None:
            raise refuse(
                nf, f"missing, and model {model!r} has neither tokens_per_second nor inference_time_mean"
            )
        out.append(derived)
    return tuple(out)


def parse_requests(doc: Any, config: Config, field: str = "requests") -> list[RequestSpec]:
    """The trace (`{"requests": [...]}` or the bare list), sorted by arrival; times count from the first request."""
    if isinstance(doc, dict):
        items = sequence(mapping(doc, field).get("requests"), f"{field}.requests")
        field = f"{field}.requests"
    else:
        items = sequence(doc, field)
    if not items:
        raise refuse(field, "the trace has no requests")
    seen: set[str] = set()
    parsed: list[tuple[float, str, str, tuple[float, ...]]] = []
    for i, item in enumerate(items):
        rf = f"{field}[{i}]"
        req = mapping(item, rf)
        rid = req.get("request_id")
        if isinstance(rid, int) and not isinstance(rid, bool):
            rid = str(rid)  # YAML reads `request_id: 7` as a number
        rid = text(rid, f"{rf}.request_id")
        if rid in seen:
            raise refuse(f"{rf}.request_id", f"duplicate request id {rid!r}", rid)
        seen.add(rid)
        wid = text(req.get("workflow_id"), f"{rf}.workflow_id")
        if wid not in config.workflows:
            raise refuse(f"{rf}.workflow_id", f"unknown workflow {wid!r}", wid)
        at = _instant(req.get("timestamp"), f"{rf}.timestamp")
        parsed.append((at, rid, wid, _seconds(req, config, wid, rf)))
    t0 = min(p[0] for p in parsed)
    parsed.sort(key=lambda p: p[0])
    return [RequestSpec(rid, wid, at - t0, secs) for at, rid, wid, secs in parsed]


class Workload:
    """Every step of a trace in flat lists indexed by step number, as the simulator and policies read them.

    Steps of one request are numbered consecutively in their workflow's topological order, so a reverse walk of a
    request's range visits children before parents.
    """

    def __init__(self, config: Config, requests: list[RequestSpec], mode: str = "online") -> None:
        self.config = config
        self.mode = mode
        used = sorted({m for r in requests for m in config.workflows[r.workflow_id].models})
        self.models: list[ModelSpec] = [config.models[m] for m in used]
        self.model_index = {m: i for i, m in enumerate(used)}
        self.request_ids = [r.request_id for r in requests]
        self.workflow_ids = [r.workflow_id for r in requests]
        self.arrival = [0.0 if mode == "offline" else r.arrival for r in requests]
        self.first: list[int] = []
        self.req: list[int] = []
        self.node: list[str] = []
        self.model: list[int] = []
        self.seconds: list[float] = []
        self.gpus: list[int] = []
        self.parents: list[tuple[int, ...]] = []
        self.children: list[list[int]] = []
        for r, spec in enumerate(requests):
            wf = config.workflows[spec.workflow_id]
            base = len(self.req)
            self.first.append(base)
            for pos, (nid, mname) in enumerate(zip(wf.node_ids, wf.models, strict=True)):
                m = self.model_index[mname]
                self.req.append(r)
                self.node.append(nid)
                self.model.append(m)
                self.seconds.append(spec.seconds[pos])
                self.gpus.append(self.models[m].gpus_required)
                self.parents.append(tuple(base + p for p in wf.parents[pos]))
                self.children.append([])
                for p in wf.parents[pos]:
                    self.children[base + p].append(base + pos)
        self.first.append(len(self.req))

    @property
    def steps(self) -> int:
        return len(self.req)

    def steps_of(self, r: int) -> range:
        """The step numbers of request `r`."""
        return range(self.first[r], self.first[r + 1])

    def upward_rank(self) -> list[float]:
        """HEFT's upward rank: a step's own seconds plus the longest chain of seconds below it (loads left out)."""
        rank = [0.0] * self.steps
        for r in range(len(self.request_ids)):
            for s in reversed(self.steps_of(r)):
                rank[s] = self.seconds[s] + max((rank[c] for c in self.children[s]), default=0.0)
        return rank

    def gpu_work(self) -> float:
        """GPU-seconds of execution in the whole trace (every step's seconds times its GPUs), loads left out."""
        return sum(s * k for s, k in zip(self.seconds, self.gpus, strict=True))

    def lower_bound(self, gpus: int) -> float:
        """A makespan no schedule can beat: max(GPU-work / GPUs, latest arrival + critical path), loads ignored."""
        rank = self.upward_rank()
        path = max(
            (self.arrival[r] + max(rank[s] for s in self.steps_of(r)) for r in range(len(self.request_ids))),
            default=0.0,
        )
        return max(self.gpu_work() / gpus, path)
