"""The one interface every policy implements, and helpers two or more policies share.

A policy hears of arrivals, ready steps and step ends, and answers `dispatch(now)` by yielding the steps to start now
on idle GPUs; each decision takes effect (GPUs busy, model resident) before the generator resumes, so the next one
sees it. The simulator and live placement drive the same calls, so a policy never reads a clock of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..cluster import Cluster, Group
from ..workload import Workload

Decision = tuple[int, Group]


class Driver(Protocol):
    """What drives a policy: the simulator, or live placement offering the same three things."""

    workload: Workload  # the steps, their models, seconds, parents and requests
    cluster: Cluster  # who is busy, what each GPU holds, where weights are
    ready: list[bool]  # per step: its parents are done and its request has arrived


class Policy:
    """Base of all policies: keeps the simulation, its workload and cluster at hand."""

    name = "policy"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def bind(self, sim: Driver) -> None:
        """Called once before the first event."""
        self.sim = sim
        self.w: Workload = sim.workload
        self.c: Cluster = sim.cluster

    def on_arrival(self, r: int, now: float) -> None:
        """Request `r` arrived (its ready steps follow through `on_ready`)."""

    def on_ready(self, s: int, now: float) -> None:
        """Step `s` has all its parents done (and its request has arrived)."""
        raise NotImplementedError

    def on_finish(self, s: int, gpus: Group, now: float) -> None:
        """Step `s` ended and `gpus` are idle again."""

    def dispatch(self, now: float) -> Iterator[Decision]:
        """The steps to start now, each with the idle GPUs it takes."""
        raise NotImplementedError

    def wakeup(self, now: float) -> float | None:
        """A later time at which to be asked again even if nothing happens (a bounded wait ending)."""
        return None


def lru_key(c: Cluster) -> Callable[[int], tuple[bool, float, int]]:
    """Victim order for a cold load: an empty GPU first, then the one idle the longest."""
    return lambda g: (c.model_on(g) is not None, c.free_at[g], g)


def idle_group(
    c: Cluster, m: int, key: Callable[[int], Any] | None = None, warm: bool = True
) -> Group | None:
    """Idle GPUs on one node for model `m`: a warm group if there is one (and `warm`), else the best by `key`."""
    k = c.models[m].gpus_required
    if warm:
        for g in c.holders(m):
            if g in c.idle:
                grp = c.residency.held[g][m]
                if all(x in c.idle for x in grp):
                    return grp
    key = key or lru_key(c)
    best: tuple[Any, Group] | None = None
    for node in range(len(c.eligible[m])):
        free = c.idle_on(m, node)
        if len(free) < k:
            continue
        free.sort(key=key)
        pick = tuple(sorted(free[:k]))
        score = key(free[k - 1])
        if best is None or score < best[0]:
            best = (score, pick)
    return best[1] if best else None


class Committed(Policy):
    """Policies that commit each step to GPUs ahead of time: it starts once they are free and it is ready.

    Every GPU keeps a FIFO of committed steps; a step starts when it heads the FIFO of each of its GPUs. Steps are
    committed in one global order, so no two steps can wait on each other.
    """

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        self.queues: list[deque[int]] = [deque() for _ in range(self.c.gpus)]
        self.target: dict[int, Group] = {}

    def commit(self, s: int, gpus: Group) -> None:
        """Queue step `s` on `gpus`."""
        self.target[s] = gpus
        for g in gpus:
            self.queues[g].append(s)

    def dispatch(self, now: float) -> Iterator[Decision]:
        ready, idle = self.sim.ready, self.c.idle
        for g in sorted(idle):
            q = self.queues[g]
            if not q or g not in idle:
                continue
            s = q[0]
            gpus = self.target[s]
            if ready[s] and all(x in idle and self.queues[x][0] == s for x in gpus):
                for x in gpus:
                    self.queues[x].popleft()
                del self.target[s]
                yield s, gpus
