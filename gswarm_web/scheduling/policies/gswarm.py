"""`gswarm`, the default policy: model-aware, tier-aware placement that trades waiting for a warm GPU against a load.

Ideas it takes from others: ServerlessLLM picks the server where weights are in the fastest tier (DRAM before disk
before the network); Ray Serve's model multiplexing and Clockwork route work to GPUs that already hold the model and
evict the least needed one; AlpaServe sizes each model's replicas to its load; HEFT orders by upward rank.

What it does:
- Ready steps wait in one queue per model, oldest request first online, highest upward rank first offline.
- A GPU that frees takes the next step of the model it holds (batching one model's steps back to back), unless
  another model is far worse served (its backlog per replica exceeds this model's by more than a load).
- An idle GPU with nothing of its own loads the model under the most pressure: backlog per replica (queued
  GPU-seconds plus what its replicas still run) beyond what a load costs, so a step waits a bounded time for a
  warm GPU rather than paying a load that would not finish it sooner.
- The GPU it loads onto is the cheapest: the shortest load (weights in DRAM before disk, peer, hub) plus the
  expected cost of reloading what it evicts (its recent demand per remaining replica).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..cluster import Group
from .base import Decision, Policy

if TYPE_CHECKING:
    from ..simulator import Simulation

INF = float("inf")


class Gswarm(Policy):
    """Warm-first batching with per-model backlog pressure deciding loads; see the module docstring."""

    name = "gswarm"

    def bind(self, sim: Simulation) -> None:
        super().bind(sim)
        o = self.options
        self.patience = float(o.get("patience", 1.0))  # extra loads' worth of backlog before adding a replica
        self.window = float(o.get("window_seconds", 120.0))  # memory of the demand estimate
        w = self.w
        models = len(w.models)
        self.offline = w.mode == "offline"
        self.rank = w.upward_rank()
        self.queues: list[list[tuple[float, float, int]]] = [[] for _ in range(models)]
        self.backlog = [0.0] * models  # queued GPU-seconds per model
        self.rate = [0.0] * models  # recent GPU-seconds of demand per second, per model
        self.rate_at = [0.0] * models

    # -- bookkeeping -------------------------------------------------------------------------------------------

    def on_ready(self, s: int, now: float) -> None:
        w, m = self.w, self.w.model[s]
        first = 0.0 if self.offline else w.arrival[w.req[s]]
        heapq.heappush(self.queues[m], (first, -self.rank[s], s))
        work = w.seconds[s] * w.gpus[s]
        self.backlog[m] += work
        self.rate[m] = self.rate[m] * math.exp((self.rate_at[m] - now) / self.window) + work / self.window
        self.rate_at[m] = now

    def _pop(self, m: int) -> int:
        s = heapq.heappop(self.queues[m])[2]
        self.backlog[m] -= self.w.seconds[s] * self.w.gpus[s]
        return s

    def _demand(self, m: int, now: float) -> float:
        """Recent demand of `m` in busy GPUs (GPU-seconds per second)."""
        return self.rate[m] * math.exp((self.rate_at[m] - now) / self.window)

    # -- estimates ---------------------------------------------------------------------------------------------

    def _replicas(self, m: int) -> float:
        return len(self.c.holders(m)) / self.w.models[m].gpus_required

    def _drain(self, m: int, now: float, extra: float = 0.0) -> float:
        """Seconds to work off `m`'s backlog on its replicas (plus `extra` replicas); inf with none."""
        c = self.c
        replicas = self._replicas(m) + extra
        if replicas <= 0:
            return INF
        running = sum(max(0.0, c.free_at[g] - now) for g in c.holders(m) if g not in c.idle)
        return (self.backlog[m] + running) / replicas

    def _cold(self, m: int, gpus: Group, now: float) -> float:
        return self.c.load_estimate(m, gpus, now)[0]

    def _evict_cost(self, g: int, now: float) -> float:
        """Expected seconds of reloading what GPU `g` holds if it is evicted now."""
        c = self.c
        old = c.model_on(g)
        if old is None:
            return 0.0
        left = self._replicas(old) - 1.0 / self.w.models[old].gpus_required
        need = self._demand(old, now) + (self.backlog[old] > 0)
        share = min(1.0, need / (left + 1.0))
        node = c.node_of[g]
        return share * c.fleet.load_seconds(self.w.models[old], c.tiers.tier(old, node, now), node)

    def _victims(self, m: int, now: float, spare: set[int]) -> tuple[float, Group] | None:
        """The cheapest idle GPUs in `spare` to load `m` onto: load seconds plus eviction cost."""
        c, k = self.c, self.w.models[m].gpus_required
        best: tuple[float, Group] | None = None
        for gpus in c.eligible[m]:
            free = [g for g in gpus if g in spare]
            if len(free) < k:
                continue
            costs = sorted((self._evict_cost(g, now), g) for g in free)
            pick = tuple(sorted(g for _, g in costs[:k]))
            score = self._cold(m, pick, now) + sum(x for x, _ in costs[:k])
            if best is None or score < best[0]:
                best = (score, pick)
        return best

    # -- decisions ---------------------------------------------------------------------------------------------

    def _warm_group(self, m: int) -> Group | None:
        c = self.c
        for g in c.holders(m):
            if g in c.idle:
                grp = c.residency.held[g][m]
                if all(x in c.idle for x in grp) and c.residency.warm(m, grp):
                    return grp
        return None

    def _pressure(self, m: int, now: float, gpus: Group) -> float:
        """How much sooner `m`'s backlog drains with one more replica on `gpus`, less what the load costs."""
        cold = self._cold(m, gpus, now)
        before = self._drain(m, now)
        after = self._drain(m, now, extra=1.0)
        if before == INF:
            return INF
        return (before - after) - cold * (1.0 + self.patience)

    def dispatch(self, now: float) -> Iterator[Decision]:
        c = self.c
        # 1. warm: every model's queue goes to idle GPUs that hold it, back to back.
        for m, q in enumerate(self.queues):
            while q and c.idle:
                grp = self._warm_group(m)
                if grp is None:
                    break
                yield self._pop(m), grp
        # 2. cold: idle GPUs left over load the model whose backlog gains most from one more replica.
        while c.idle:
            best: tuple[float, int, Group] | None = None
            spare = set(c.idle)
            for m, q in enumerate(self.queues):
                if not q:
                    continue
                victim = self._victims(m, now, spare)
                if victim is None:
                    continue
                gain = self._pressure(m, now, victim[1]) - victim[0] + self._cold(m, victim[1], now)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, m, victim[1])
            if best is None:
                return
            yield self._pop(best[1]), best[2]
