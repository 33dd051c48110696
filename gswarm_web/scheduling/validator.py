"""The validator: checks any policy's OUT.json against the config, the trace and the fleet, trusting nothing in it.

Checks: every step of every request ran exactly once, on its model, for its execution time; dependencies (a child
starts no earlier than its parents end); no step (load included) before its request's arrival online; each GPU runs
one thing at a time over [start - switch_time, end) on every GPU a step holds, and a step holds exactly
`gpus_required` GPUs of one node; no free switch (a step whose model is not resident on its GPUs pays at least the
load from the fastest tier that could have held the weights then); memory per GPU within capacity; and the summary
(loads, load seconds, makespan, latency percentiles, steps) recomputed from the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cluster import Residency, seed_residency
from .fleet import TIERS, Fleet
from .metrics import summarize
from .workload import MODES, Workload

EPS = 1e-6
FIELDS = ("request_id", "node_id", "model_name", "gpu_id", "gpus", "start_time", "end_time", "switch_time")


@dataclass(frozen=True)
class Violation:
    """One broken rule: which check, and what broke it."""

    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= EPS * max(1.0, abs(a), abs(b))


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class _Check:
    def __init__(self, doc: Any, workload: Workload, fleet: Fleet) -> None:
        self.doc, self.w, self.fleet = doc, workload, fleet
        self.out: list[Violation] = []
        self.runs: dict[int, dict[str, Any]] = {}  # step -> its execution

    def add(self, check: str, message: str) -> None:
        """Record a violation."""
        self.out.append(Violation(check, message))

    def name(self, s: int) -> str:
        """`request/node` of step `s`, as messages name it."""
        return f"{self.w.request_ids[self.w.req[s]]}/{self.w.node[s]}"

    def shape(self) -> list[dict[str, Any]]:
        """Executions that are well formed; the others become violations."""
        if not isinstance(self.doc, dict) or not isinstance(self.doc.get("executions"), list):
            self.add("format", "the document needs an `executions` list")
            return []
        good = []
        for i, e in enumerate(self.doc["executions"]):
            bad = [f for f in FIELDS if f not in e] if isinstance(e, dict) else list(FIELDS)
            if not bad:
                nums = ("gpu_id", "start_time", "end_time", "switch_time")
                bad = [f for f in nums if not _is_number(e[f])]
                if (
                    not isinstance(e["gpus"], list)
                    or not all(isinstance(g, int) for g in e["gpus"])
                    or not e["gpus"]
                ):
                    bad.append("gpus")
            if bad:
                self.add("format", f"executions[{i}] lacks or mistypes {', '.join(bad)}")
            else:
                good.append(e)
        return good

    def once(self, executions: list[dict[str, Any]]) -> None:
        """Every step exactly once, on its model, for its execution time, on valid GPUs."""
        w = self.w
        index = {(w.request_ids[w.req[s]], w.node[s]): s for s in range(w.steps)}
        for e in executions:
            key = (e["request_id"], e["node_id"])
            s = index.get(key)
            if s is None:
                self.add("exactly once", f"{key[0]}/{key[1]} is not a step of the trace")
                continue
            if s in self.runs:
                self.add("exactly once", f"{self.name(s)} ran more than once")
                continue
            self.runs[s] = e
            self.step_fields(s, e)
        for s in range(w.steps):
            if s not in self.runs:
                self.add("exactly once", f"{self.name(s)} never ran")

    def step_fields(self, s: int, e: dict[str, Any]) -> None:
        """One execution's model, duration, times and GPUs against its step."""
        w, fleet = self.w, self.fleet
        model = w.models[w.model[s]]
        if e["model_name"] != model.name:
            self.add("model", f"{self.name(s)} ran {e['model_name']!r}, its node uses {model.name!r}")
        if not _close(e["end_time"] - e["start_time"], w.seconds[s]):
            self.add(
                "duration",
                f"{self.name(s)} ran {e['end_time'] - e['start_time']:g}s, needs {w.seconds[s]:g}s",
            )
        if e["switch_time"] < 0 or e["start_time"] - e["switch_time"] < -EPS:
            self.add("times", f"{self.name(s)} has a negative switch_time or starts loading before 0")
        gpus = e["gpus"]
        if len(set(gpus)) != len(gpus) or any(not 0 <= g < fleet.gpus for g in gpus):
            self.add(
                "gpus", f"{self.name(s)} holds GPUs {gpus}: repeated or not in the fleet of {fleet.gpus}"
            )
            return
        if len(gpus) != model.gpus_required:
            self.add(
                "gpus", f"{self.name(s)} holds {len(gpus)} GPUs, {model.name} needs {model.gpus_required}"
            )
        if len({fleet.gpu_node[g] for g in gpus}) > 1:
            self.add("gpus", f"{self.name(s)} spans nodes with GPUs {gpus}")
        if e["gpu_id"] != gpus[0]:
            self.add("gpus", f"{self.name(s)} gpu_id {e['gpu_id']} is not its first GPU {gpus[0]}")

    def order(self, mode: str) -> None:
        """Dependencies, and no step (its load included) before its request arrives online."""
        w = self.w
        for s, e in self.runs.items():
            for p in w.parents[s]:
                pe = self.runs.get(p)
                if pe is not None and e["start_time"] < pe["end_time"] - EPS:
                    self.add(
                        "dependency",
                        f"{self.name(s)} starts at {e['start_time']:g} before its parent {w.node[p]} ends at "
                        f"{pe['end_time']:g}",
                    )
            arrival = w.arrival[w.req[s]]
            if mode == "online" and e["start_time"] - e["switch_time"] < arrival - EPS:
                self.add(
                    "arrival",
                    f"{self.name(s)} begins at {e['start_time'] - e['switch_time']:g} before its "
                    f"request arrives at {arrival:g}",
                )

    def overlaps(self) -> None:
        """One thing at a time on every GPU, over [start - switch_time, end)."""
        per_gpu: dict[int, list[tuple[float, float, int]]] = {}
        for s, e in self.runs.items():
            for g in set(e["gpus"]):
                if 0 <= g < self.fleet.gpus:
                    per_gpu.setdefault(g, []).append((e["start_time"] - e["switch_time"], e["end_time"], s))
        for g, spans in sorted(per_gpu.items()):
            spans.sort()
            for (_, end, a), (begin, _, b) in zip(spans, spans[1:], strict=False):
                if begin < end - EPS:
                    self.add(
                        "overlap",
                        f"GPU {g} runs {self.name(a)} until {end:g} and {self.name(b)} from {begin:g}",
                    )

    def switches(self) -> None:
        """No free switch, loads from tiers that could hold the weights then, and memory within capacity."""
        w, fleet = self.w, self.fleet
        residency = Residency(fleet, w.models)
        reached = Reach(fleet, w)
        seed_residency(fleet, w.models, w.model_index, residency)
        runs = sorted(
            self.runs.items(), key=lambda x: (x[1]["start_time"] - x[1]["switch_time"], x[1]["start_time"])
        )
        for s, e in runs:
            gpus = tuple(sorted(e["gpus"]))
            if any(not 0 <= g < fleet.gpus for g in gpus) or len(set(gpus)) != len(gpus):
                continue
            m, begin, tier = w.model[s], e["start_time"] - e["switch_time"], e.get("loaded_from")
            node = fleet.gpu_node[gpus[0]]
            for g in gpus:
                if residency.share[m] > fleet.gpu_memory_bytes[g]:
                    self.add(
                        "memory",
                        f"{self.name(s)} needs {residency.share[m] / 1e9:g} GB on GPU {g}, which has "
                        f"{fleet.gpu_memory_bytes[g] / 1e9:g} GB",
                    )
            if tier not in (*TIERS, "config"):
                self.add(
                    "format", f"{self.name(s)} loaded_from {tier!r} is not one of {', '.join(TIERS)}, config"
                )
            elif residency.warm(m, gpus) and tier == "gpu":
                if e["switch_time"] > EPS:
                    self.add("switch", f"{self.name(s)} is warm but reports {e['switch_time']:g}s of loading")
                residency.use(m, gpus)
                continue
            elif tier == "gpu":
                last = [residency.model_on(g) for g in gpus]
                held = ", ".join("nothing" if x is None else w.models[x].name for x in last)
                self.add(
                    "free switch",
                    f"{self.name(s)} claims {w.models[m].name} was resident on GPUs {list(gpus)}, which held {held}",
                )
            else:
                need, best = reached.cost(m, node, tier, begin)
                if need is None:
                    where = f"where {w.models[m].name} is not by {begin:g}"
                    self.add("switch", f"{self.name(s)} loads from {tier}, {where}")
                elif e["switch_time"] < min(need, best) - EPS * max(1.0, need):
                    self.add(
                        "free switch",
                        f"{self.name(s)} pays {e['switch_time']:g}s to load {w.models[m].name}, "
                        f"the load takes at least {min(need, best):g}s",
                    )
            residency.load(m, gpus)
            reached.arrive(m, node, e["start_time"])

    def summary(self, executions: list[dict[str, Any]], mode: str) -> None:
        """The summary's numbers, recomputed from the executions."""
        given = self.doc.get("summary") if isinstance(self.doc, dict) else None
        if not isinstance(given, dict):
            self.add("summary", "the document needs a `summary` object")
            return
        arrivals = {rid: self.w.arrival[r] for r, rid in enumerate(self.w.request_ids)}
        want = summarize(executions, arrivals, str(given.get("policy")), mode)
        for key, value in want.items():
            got = given.get(key)
            if key in ("model_loads", "steps"):
                ok = got == value
            elif key in ("policy", "mode"):
                ok = got == value and isinstance(got, str)
            else:
                ok = (
                    isinstance(got, int | float)
                    and not isinstance(got, bool)
                    and _close(float(got), float(value))
                )
            if not ok:
                self.add("summary", f"{key} is {got!r}, the executions give {value!r}")


class Reach:
    """When a model's weights first reached each node (disk and DRAM): the fastest a later load there can be.

    DRAM eviction is ignored on purpose, so the bound is never above what a correct simulator charged.
    """

    def __init__(self, fleet: Fleet, w: Workload) -> None:
        self.fleet, self.w = fleet, w
        self.disk: list[dict[int, float]] = [{} for _ in fleet.node_names]
        self.dram: list[dict[int, float]] = [{} for _ in fleet.node_names]
        for name, places in fleet.weights.items():
            m = w.model_index.get(name)
            if m is not None:
                for node, tier, _ in places:
                    self.disk[node][m] = float("-inf")
                    if tier == "dram":
                        self.dram[node][m] = float("-inf")

    def arrive(self, m: int, node: int, at: float) -> None:
        """A load onto `node` completed at `at`: its disk and DRAM have the weights from then on."""
        for tier in (self.disk, self.dram):
            tier[node][m] = min(tier[node].get(m, at), at)

    def cost(self, m: int, node: int, tier: str, at: float) -> tuple[float | None, float]:
        """Seconds of a load from `tier` (None if the weights cannot be there at `at`), and the fastest possible."""
        fleet, spec = self.fleet, self.w.models[m]
        if fleet.uniform:
            return (spec.load_time_seconds if tier == "config" else None), spec.load_time_seconds
        possible = {"hub"}
        if self.dram[node].get(m, at + 1) <= at + EPS:
            possible.add("dram")
        if self.disk[node].get(m, at + 1) <= at + EPS:
            possible.add("disk")
        if any(d.get(m, at + 1) <= at + EPS for n, d in enumerate(self.disk) if n != node):
            possible.add("peer")
        best = min(fleet.load_seconds(spec, t, node) for t in possible)
        return (fleet.load_seconds(spec, tier, node) if tier in possible else None), best


def validate(doc: Any, workload: Workload, fleet: Fleet, mode: str | None = None) -> list[Violation]:
    """Every violation of `doc` (an OUT.json document) against the trace and fleet; empty when it is valid.

    `mode` defaults to the summary's; `workload` must have been built in that mode (arrivals at 0 offline).
    """
    check = _Check(doc, workload, fleet)
    summary = doc.get("summary") if isinstance(doc, dict) else None
    mode = mode or (summary.get("mode") if isinstance(summary, dict) else None) or workload.mode
    if mode not in MODES:
        check.add("summary", f"mode {mode!r} is not one of {', '.join(MODES)}")
        mode = workload.mode
    executions = check.shape()
    check.once(executions)
    check.order(mode)
    check.overlaps()
    check.switches()
    check.summary(executions, mode)
    return check.out
