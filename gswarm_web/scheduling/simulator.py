"""The event-driven simulator: arrivals, step ends and policy timers on one heap; the policy decides what starts.

Every step is pushed and popped once (its end), every request once (its arrival), and every edge is touched once
when its parent ends, so the simulator's own work is O((S + E) log S) for S steps and E edges; what the policy
spends per decision comes on top (O(GPUs + models) for the built-in ones: no policy rescans the whole queue).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .cluster import Cluster, Group
from .fleet import Fleet
from .metrics import summarize
from .workload import Workload

if TYPE_CHECKING:
    from .policies.base import Policy

ARRIVAL, FINISH, TIMER = 0, 1, 2


@dataclass
class Execution:
    """Where and when one step ran, and the load it paid just before."""

    step: int
    gpus: Group
    start: float
    end: float
    switch: float
    tier: str


class PolicyError(RuntimeError):
    """A policy asked for something impossible (a busy GPU, a step not ready) or left steps unscheduled."""


class Simulation:
    """One run of a policy over a workload on a fleet."""

    def __init__(self, workload: Workload, fleet: Fleet, policy: Policy) -> None:
        self.workload = workload
        self.fleet = fleet
        self.policy = policy
        self.cluster = Cluster(fleet, workload.models, workload.model_index)
        self.now = 0.0
        self.waiting = [len(p) for p in workload.parents]  # parents not yet finished
        self.ready = [False] * workload.steps
        self.runs: list[Execution | None] = [None] * workload.steps
        self._events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._timer = float("inf")

    def _push(self, t: float, kind: int, item: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, item))

    def start(self, s: int, gpus: Group) -> Execution:
        """Start step `s` on idle `gpus` now (the policy's decision), loading its model first when needed."""
        w, c = self.workload, self.cluster
        if not self.ready[s] or self.runs[s] is not None:
            raise PolicyError(f"{self.policy.name}: step {s} is not ready to start")
        if len(gpus) != w.gpus[s] or len(set(gpus)) != len(gpus) or any(g not in c.idle for g in gpus):
            raise PolicyError(f"{self.policy.name}: step {s} needs {w.gpus[s]} idle GPUs, got {gpus}")
        if len({c.node_of[g] for g in gpus}) != 1:
            raise PolicyError(f"{self.policy.name}: step {s} spans nodes {gpus}")
        group = tuple(sorted(gpus))
        switch, tier = c.occupy(w.model[s], group, self.now, w.seconds[s])
        run = Execution(s, group, self.now + switch, self.now + switch + w.seconds[s], switch, tier)
        self.runs[s] = run
        self._push(run.end, FINISH, s)
        return run

    def _arrive(self, r: int) -> None:
        self.policy.on_arrival(r, self.now)
        for s in self.workload.steps_of(r):
            if not self.waiting[s]:
                self._make_ready(s)

    def _make_ready(self, s: int) -> None:
        self.ready[s] = True
        self.policy.on_ready(s, self.now)

    def _finish(self, s: int) -> None:
        run = self.runs[s]
        assert run is not None
        self.cluster.release(run.gpus)
        self.policy.on_finish(s, run.gpus, self.now)
        for child in self.workload.children[s]:
            self.waiting[child] -= 1
            if not self.waiting[child]:
                self._make_ready(child)

    def run(self) -> list[Execution]:
        """Play the whole trace; every step ends up in exactly one execution."""
        w = self.workload
        self.policy.bind(self)
        for r, at in enumerate(w.arrival):
            self._push(at, ARRIVAL, r)
        events = self._events
        while events:
            self.now = events[0][0]
            while events and events[0][0] <= self.now:
                _, kind, _, item = heapq.heappop(events)
                if kind == ARRIVAL:
                    self._arrive(item)
                elif kind == FINISH:
                    self._finish(item)
                else:
                    self._timer = float("inf")
            for s, gpus in self.policy.dispatch(self.now):
                self.start(s, gpus)
            wake = self.policy.wakeup(self.now)
            if wake is not None and self.now < wake < self._timer:
                self._timer = wake
                self._push(wake, TIMER, -1)
        runs = [r for r in self.runs if r is not None]
        if len(runs) != w.steps:
            raise PolicyError(f"{self.policy.name}: {w.steps - len(runs)} steps were never started")
        return runs


def document(
    workload: Workload, fleet: Fleet, runs: list[Execution], policy: str, mode: str
) -> dict[str, Any]:
    """The OUT.json document: executions in start order and the summary recomputed from them."""
    w = workload
    executions = [
        {
            "request_id": w.request_ids[w.req[e.step]],
            "node_id": w.node[e.step],
            "model_name": w.models[w.model[e.step]].name,
            "gpu_id": e.gpus[0],
            "gpus": list(e.gpus),
            "start_time": e.start,
            "end_time": e.end,
            "switch_time": e.switch,
            "loaded_from": e.tier,
        }
        for e in sorted(runs, key=lambda e: (e.start, e.gpus))
    ]
    arrivals = {rid: w.arrival[r] for r, rid in enumerate(w.request_ids)}
    return {"executions": executions, "summary": summarize(executions, arrivals, policy, mode)}


def simulate(workload: Workload, fleet: Fleet, policy: Policy) -> dict[str, Any]:
    """Run `policy` over `workload` on `fleet` and return the OUT.json document."""
    runs = Simulation(workload, fleet, policy).run()
    return document(workload, fleet, runs, policy.name, workload.mode)
