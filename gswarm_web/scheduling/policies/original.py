"""The original scheduler's two ideas, made correct: `offline` (batch by model) and `online` (weighted cost).

The original's offline schedules broke dependencies and overlapped steps because batches ran serially on a GPU
without waiting for parents; here a batch is only an order of commitment, and every step still starts when its
parents are done and its GPUs are free. The original's online cost ranked a long-waiting task as more costly, so
old tasks starved; here waiting lowers the cost.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterator

from ..cluster import Group
from .base import Decision, Driver, Policy, idle_group
from .eft import Eft


class OfflineBatch(Eft):
    """Known steps grouped into batches by (topological level, model), batches in level order and largest first;
    each step of a batch committed where it finishes first, so one model's steps run back to back on warm GPUs."""

    name = "offline"

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        self.arrived: list[int] = []
        self.level = [0] * self.w.steps
        self.planned_end = [0.0] * self.w.steps

    def on_arrival(self, r: int, now: float) -> None:
        self.arrived.append(r)

    def on_ready(self, s: int, now: float) -> None:
        """Steps were committed when their request arrived."""

    def _plan(self, now: float) -> None:
        w = self.w
        batches: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in self.arrived:
            for s in w.steps_of(r):
                self.level[s] = 1 + max((self.level[p] for p in w.parents[s]), default=-1)
                batches[(self.level[s], w.model[s])].append(s)
        self.arrived = []
        work = {key: sum(w.seconds[s] for s in steps) for key, steps in batches.items()}
        for key in sorted(batches, key=lambda k: (k[0], -work[k], k[1])):
            for s in batches[key]:
                ready_at = max([now, *(self.planned_end[p] for p in w.parents[s])])
                self.planned_end[s] = self.place(s, ready_at, now)

    def dispatch(self, now: float) -> Iterator[Decision]:
        if self.arrived:
            self._plan(now)
        yield from super().dispatch(now)


class OnlineCost(Policy):
    """Each idle GPU takes the ready step of least weighted cost: alpha x (-seconds waited) + beta x load seconds +
    gamma x reloads it forces on queued steps of the model it evicts + delta x its busy-time excess (balance)."""

    name = "online"

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        o = self.options
        self.alpha, self.beta = float(o.get("alpha", 1.0)), float(o.get("beta", 1.5))
        self.gamma, self.delta = float(o.get("gamma", 0.3)), float(o.get("delta", 0.5))
        self.lookahead = int(o.get("lookahead", 3))
        self.queues: dict[int, deque[tuple[float, int]]] = defaultdict(deque)
        self.busy = [0.0] * self.c.gpus

    def on_ready(self, s: int, now: float) -> None:
        self.queues[self.w.model[s]].append((now, s))

    def on_finish(self, s: int, gpus: Group, now: float) -> None:
        for g in gpus:
            self.busy[g] += self.w.seconds[s]

    def _cost(self, s: int, since: float, g: int, gpus: Group, now: float, mean_busy: float) -> float:
        c, m = self.c, self.w.model[s]
        load, _ = c.load_estimate(m, gpus, now)
        future = 0.0
        old = c.model_on(g)
        if load and old is not None and old != m and self.queues.get(old):
            others = [x for x in c.holders(old) if x in c.idle and x not in gpus]
            if not others:
                queued = min(len(self.queues[old]), self.lookahead)
                node = c.node_of[g]
                future = queued * c.fleet.load_seconds(self.w.models[old], c.tiers.tier(old, node, now), node)
        balance = (self.busy[g] - mean_busy) / max(now, 1.0)
        return -self.alpha * (now - since) + self.beta * load + self.gamma * future + self.delta * balance

    def dispatch(self, now: float) -> Iterator[Decision]:
        c = self.c
        mean_busy = sum(self.busy) / c.gpus
        for g in sorted(c.idle):
            if g not in c.idle:
                continue
            best: tuple[float, int, Group | None] | None = None
            for m, q in self.queues.items():
                if not q or g not in c.eligible_sets[m][c.node_of[g]]:
                    continue
                since, s = q[0]
                gpus = self._group_with(m, g)
                cost = self._cost(s, since, g, gpus or (g,), now, mean_busy)
                if best is None or cost < best[0]:
                    best = (cost, s, gpus)
            # A multi-GPU step that wins but lacks GPUs keeps this one idle for itself, so it cannot starve.
            if best is not None and best[2] is not None:
                self.queues[self.w.model[best[1]]].popleft()
                yield best[1], best[2]

    def _group_with(self, m: int, g: int) -> Group | None:
        """Idle GPUs for model `m` that include idle GPU `g`, warm ones first (None if too few are idle)."""
        c = self.c
        if c.models[m].gpus_required == 1:
            return (g,)
        grp = idle_group(c, m)
        return grp if grp is not None and g in grp else None
