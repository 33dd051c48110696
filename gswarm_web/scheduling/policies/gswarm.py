"""`gswarm`, the default policy: model-aware, tier-aware placement that trades waiting for a warm GPU against a load.

Ideas it takes from others: ServerlessLLM picks the server whose tier holds the weights closest (DRAM before disk
before the network) and counts queueing into startup time; Ray Serve's model multiplexing and Clockwork send work to
GPUs that already hold the model and evict the least needed one; AlpaServe sizes each model's replicas to its load;
HEFT orders by upward rank.

How it decides, with `drain(m)` = seconds to work off model m's queue on the busy GPUs holding it (queued
GPU-seconds plus what they still run, over their number):
- Ready steps wait in one queue per model: oldest request first online, highest upward rank first offline.
- A GPU that frees takes the next step of the model it holds, so one model's steps run back to back (batching).
  Only a model no GPU holds, starving (its oldest step waited `starve_loads` of its loads, and longer than this
  model's queue would wait without the GPU), takes a busy model's GPU instead.
- An idle GPU with nothing of its own loads the model whose queue waits longest, if that wait exceeds the load
  plus `patience` loads plus the eviction's cost: a step waits a bounded time for a warm GPU rather than pay a
  load that would not finish it sooner. A model no GPU holds counts its oldest step's wait plus its queue's work,
  so online a burst of one model is loaded once and run as a batch; offline (nothing more will arrive) it loads
  at once, the longest upward rank first.
- The GPUs it loads onto are the cheapest: the shortest load (weights in DRAM before disk, peer, hub) plus the
  expected cost of reloading what they hold: for a last copy, the chance one of its steps arrives meanwhile (its
  recent step rate), else its recent demand over the copies left; nothing when the memory rule keeps both.
- A multi-GPU model that wins while too few GPUs are free reserves them and waits for the rest of its group on
  that node, so it cannot starve behind single-GPU work.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from ..cluster import Group
from .base import Decision, Driver, Policy

INF = float("inf")


class Gswarm(Policy):
    """Warm-first batching, drain-time balancing of replicas, tier-aware loads; see the module docstring."""

    name = "gswarm"

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        o = self.options
        self.patience = float(o.get("patience", 0.5))  # loads' worth of extra waiting before paying a load
        self.window = float(o.get("window_seconds", 60.0))  # memory of the demand estimate
        self.starve = float(
            o.get("starve_loads", 30.0)
        )  # a model no GPU holds waits about this many loads at most
        w = self.w
        self.offline = w.mode == "offline"
        # Offline only the makespan counts and every queue drains in the end, so no GPU is taken from busy work.
        self.switching = bool(o.get("switch", not self.offline))
        self.rank = w.upward_rank()
        self.queues: list[list[tuple[float, float, int]]] = [[] for _ in w.models]
        self.backlog = [0.0] * len(w.models)  # queued GPU-seconds per model
        self.rate = [0.0] * len(w.models)  # recent GPU-seconds of demand per second, per model
        self.steps_rate = [0.0] * len(w.models)  # recent steps made ready per second, per model
        self.rate_at = [0.0] * len(w.models)
        self.reserved: dict[int, tuple[int, set[int]]] = {}  # node -> (model, idle GPUs kept for it)
        self.ready_at = [0.0] * w.steps
        self._wake = INF
        self._evicting: dict[int, tuple[float | None, float, float]] = {}  # see `_evict_cost`

    # -- bookkeeping -------------------------------------------------------------------------------------------

    def on_ready(self, s: int, now: float) -> None:
        w, m = self.w, self.w.model[s]
        first = 0.0 if self.offline else w.arrival[w.req[s]]
        heapq.heappush(self.queues[m], (first, -self.rank[s], s))
        self.ready_at[s] = now
        work = w.seconds[s] * w.gpus[s]
        self.backlog[m] += work
        decay = self._decay(m, now)
        self.rate[m] = self.rate[m] * decay + work / self.window
        self.steps_rate[m] = self.steps_rate[m] * decay + 1.0 / self.window
        self.rate_at[m] = now

    def _pop(self, m: int) -> int:
        """The next step of `m`'s queue, taken off it."""
        s = heapq.heappop(self.queues[m])[2]
        # an empty queue resets the sum, so float rounding cannot leave a phantom backlog behind
        self.backlog[m] = self.backlog[m] - self.w.seconds[s] * self.w.gpus[s] if self.queues[m] else 0.0
        return s

    def _decay(self, m: int, now: float) -> float:
        """How much of `m`'s recent rates is left at `now` (they fade over `window` seconds)."""
        return math.exp((self.rate_at[m] - now) / self.window)

    # -- estimates ---------------------------------------------------------------------------------------------

    def drain(self, m: int, now: float, gpus: int = 0) -> float:
        """Seconds to work off `m`'s queue on the busy GPUs holding it (with `gpus` more); inf with none.

        Idle holders do not count: after the warm pass, an idle GPU holding `m` is kept for another model.
        """
        c = self.c
        busy = [g for g in c.holders(m) if g not in c.idle]
        count = len(busy) + gpus
        if count <= 0:
            return INF
        return (self.backlog[m] + sum(max(0.0, c.free_at[g] - now) for g in busy)) / count

    def _load(self, m: int, gpus: Group, now: float) -> float:
        return self.c.load_estimate(m, gpus, now)[0]

    def _evict_cost(self, g: int, m: int, now: float) -> float:
        """Expected seconds of reloading what `m` would push off GPU `g` now (0 if nothing has to go).

        The last copy of a model is needed again with the chance that one of its steps arrives while `g` is tied
        up with `m` (from its recent step rate); a model with other copies only when they would be busy (its recent
        demand in busy GPUs over the copies left)."""
        res = self.c.residency
        held = res.held[g]
        if not held:
            return 0.0
        old = next(reversed(held))  # the model `g` used last
        if old == m or (not res.one_model and res.used[g] + res.share[m] <= res.memory[g]):
            return 0.0
        # What does not depend on `m` is worked out once per GPU while nothing changes (`_cold` resets it).
        known = self._evicting.get(g)
        if known is None:
            known = self._evicting[g] = self._evict_terms(g, old, now)
        cost, reload, rate = known
        if cost is not None:
            return cost
        c = self.c
        busy_for = reload + self._load(m, (g,), now) + self.backlog[m] / max(1, len(c.holders(m)) + 1)
        need = 1.0 - math.exp(-rate * busy_for)
        return need * reload

    def _evict_terms(self, g: int, old: int, now: float) -> tuple[float | None, float, float]:
        """(the cost of evicting `old` from `g` when it does not depend on the newcomer, else None; the reload's
        seconds; the last copy's step rate now)."""
        if self.queues[old]:
            return INF, 0.0, 0.0  # it has queued work of its own: taking it is a switch, weighed in `_switch`
        c = self.c
        node = c.node_of[g]
        reload = c.fleet.load_seconds(self.w.models[old], c.tiers.tier(old, node, now), node)
        left = len(c.holders(old)) - self.w.models[old].gpus_required
        decay = self._decay(old, now)
        if left <= 0:
            return None, reload, self.steps_rate[old] * decay
        return min(1.0, self.rate[old] * decay / left) * reload, reload, 0.0

    def _best_gpus(self, m: int, now: float, free_on: list[list[int]]) -> tuple[float, float, Group] | None:
        """The cheapest free GPUs (`free_on`: per node) for `m` on one node: (load seconds, eviction cost, GPUs)."""
        k = self.w.models[m].gpus_required
        best: tuple[float, float, Group] | None = None
        for node, eligible in enumerate(self.c.eligible_sets[m]):
            # the free GPUs (few, on a busy fleet) are walked, not every GPU of the node
            cand = [(self._evict_cost(g, m, now), g) for g in free_on[node] if g in eligible]
            if len(cand) < k:
                continue
            if k == 1:
                cand = [min(cand)]
            else:
                cand.sort()
            if cand[k - 1][0] == INF:
                continue
            gpus = tuple(sorted(g for _, g in cand[:k]))
            load, evict = self._load(m, gpus, now), sum(x for x, _ in cand[:k])
            if best is None or load + evict < best[0] + best[1]:
                best = (load, evict, gpus)
        return best

    def _least_load(self, m: int, now: float, free_on: list[list[int]]) -> float:
        """A lower bound of the load `_best_gpus` could find for `m` on the free GPUs (inf if none can take it)."""
        c, k = self.c, self.w.models[m].gpus_required
        least = INF
        holders = c.holders(m)
        for node, eligible in enumerate(self.c.eligible_sets[m]):
            free = [g for g in free_on[node] if g in eligible]
            if len(free) < k:
                continue
            if any(g in holders for g in free):
                return 0.0  # perhaps warm
            least = min(least, c.fleet.load_seconds(self.w.models[m], c.tiers.tier(m, node, now), node))
        return least

    def wait(self, m: int, now: float, drain: float | None = None) -> float:
        """How long `m`'s queued steps wait as things stand: the drain time on the GPUs holding it (`drain`, when the
        caller has it), or with none, how long its oldest step has waited plus the queue's work on one new replica."""
        d = self.drain(m, now) if drain is None else drain
        if d < INF:
            return d
        head = self.queues[m][0][2]
        if self.offline:
            # no arrival is coming to batch with, so a free GPU starts at once, longest path below first
            return 1e9 + self.rank[head]
        return now - self.ready_at[head] + self.backlog[m] / self.w.models[m].gpus_required

    def _keep(self, m: int, grp: Group, now: float) -> float:
        """How long `m`'s queue would wait if `grp` went to another model, plus the patience a reload is worth."""
        c = self.c
        node = c.node_of[grp[0]]
        reload = c.fleet.load_seconds(self.w.models[m], c.tiers.tier(m, node, now), node)
        d = self.drain(m, now)
        if d == INF:
            d = self.backlog[m] / self.w.models[m].gpus_required + reload
        return d + self.patience * reload

    # -- decisions ---------------------------------------------------------------------------------------------

    def _warm_group(self, m: int) -> Group | None:
        """Idle, unreserved GPUs that hold `m` as one group."""
        c, idle, reserved = self.c, self.c.idle, self._is_reserved if self.reserved else None
        for g in c.holders(m):
            if g in idle and not (reserved and reserved(g)):
                grp = c.residency.held[g][m]
                if c.residency.warm(m, grp) and all(
                    x in idle and not (reserved and reserved(x)) for x in grp
                ):
                    return grp
        return None

    def _is_reserved(self, g: int) -> bool:
        held = self.reserved.get(self.c.node_of[g])
        return held is not None and g in held[1]

    def _want(self, m: int, now: float, load: float, evict: float, drain: float | None = None) -> float:
        """How much longer `m`'s queue waits than a load here (plus patience and eviction) would cost."""
        return self.wait(m, now, drain) - load * (1.0 + self.patience) - evict

    def _switch(self, m: int, grp: Group, now: float) -> int | None:
        """A starving model these warm GPUs should go to instead of `m`'s next step, if any.

        Only a model no GPU holds, whose oldest step has waited `starve` of its loads and longer than `m`'s queue
        would wait without these GPUs, takes them: switching busy GPUs otherwise costs more loads than it saves.
        """
        c, node = self.c, self.c.node_of[grp[0]]
        keep: float | None = None
        best: tuple[float, int] | None = None
        for x, q in enumerate(self.queues):
            k = self.w.models[x].gpus_required
            if x == m or not q or c.holders(x) or k < len(grp) or grp[0] not in c.eligible_sets[x][node]:
                continue
            if k > len(grp) and (node in self.reserved or len(c.eligible[x][node]) < k):
                continue
            load = c.fleet.load_seconds(self.w.models[x], c.tiers.tier(x, node, now), node)
            waited = now - self.ready_at[q[0][2]]
            if waited < self.starve * load:
                continue
            keep = self._keep(m, grp, now) if keep is None else keep
            if waited > keep and (best is None or waited > best[0]):
                best = (waited, x)
        return None if best is None else best[1]

    def _warm(self, now: float) -> Iterator[Decision]:
        """Queues to idle GPUs that hold their model, unless a worse-served model should take the GPUs."""
        for m, q in enumerate(self.queues):
            while q and self.c.idle:
                grp = self._warm_group(m)
                if grp is None:
                    break
                x = self._switch(m, grp, now) if self.switching else None
                if x is None:
                    yield self._pop(m), grp
                elif self.w.models[x].gpus_required == len(grp):
                    yield self._pop(x), grp
                else:
                    self.reserved[self.c.node_of[grp[0]]] = (x, set(grp))  # the rest of its group follows

    def _reservations(self, now: float) -> Iterator[Decision]:
        """Idle GPUs join the reservation on their node; a complete group starts its model's next step."""
        c = self.c
        for node, (m, held) in list(self.reserved.items()):
            if not self.queues[m]:
                del self.reserved[node]
                continue
            k = self.w.models[m].gpus_required
            for g in sorted(c.idle):
                if len(held) < k and c.node_of[g] == node and g in c.eligible_sets[m][node]:
                    held.add(g)
            held &= c.idle
            if len(held) >= k:
                del self.reserved[node]
                yield self._pop(m), tuple(sorted(held)[:k])

    def _cold(self, now: float) -> Iterator[Decision]:
        """Idle GPUs left over load the model whose queue drains slowest, when that beats waiting for a warm GPU."""
        c, skip = self.c, set()
        while True:
            self._evicting = {}
            free = {g for g in c.idle if not self._is_reserved(g)} if self.reserved else set(c.idle)
            if not free:
                return
            free_on: list[list[int]] = [[] for _ in c.node_gpus]
            for g in free:
                free_on[c.node_of[g]].append(g)
            best: tuple[float, int, Group | None] | None = None
            for m, q in enumerate(self.queues):
                if not q or m in skip:
                    continue
                drain = self.drain(
                    m, now
                )  # nothing changes within one pass: each model's drain is taken once
                if drain < INF and self._want(m, now, self._least_load(m, now, free_on), 0.0, drain) <= 0:
                    continue  # no load here can be worth it (evictions only add): skip pricing them
                pick = self._best_gpus(m, now, free_on)
                if pick is not None:
                    want, gpus = self._want(m, now, pick[0], pick[1], drain), pick[2]
                    if want <= 0 and drain == INF:
                        # nothing running will free a GPU for it: ask again when its wait outgrows the load
                        self._wake = min(self._wake, now - want + 1e-9)
                elif self.w.models[m].gpus_required > 1 and drain == INF:
                    want, gpus = (
                        self._want(m, now, 0.0, 0.0, drain),
                        None,
                    )  # too few free: reserve what there is
                else:
                    continue
                if want > 0 and (best is None or want > best[0]):
                    best = (want, m, gpus)
            if best is None:
                return
            if best[2] is None:
                skip.add(best[1])
                self._reserve(best[1], free)
                continue
            yield self._pop(best[1]), best[2]

    def _reserve(self, m: int, free: set[int]) -> None:
        """Keep the free eligible GPUs of the best node for multi-GPU model `m` until its group is complete."""
        c, k = self.c, self.w.models[m].gpus_required
        nodes = [n for n, gs in enumerate(c.eligible[m]) if n not in self.reserved and len(gs) >= k]
        if nodes:
            node = max(nodes, key=lambda n: sum(1 for g in c.eligible[m][n] if g in free))
            self.reserved[node] = (m, {g for g in c.eligible[m][node] if g in free})

    def wakeup(self, now: float) -> float | None:
        """When a bounded wait ends for a model nothing running will free a GPU for."""
        return self._wake if self._wake < INF else None

    def dispatch(self, now: float) -> Iterator[Decision]:
        self._wake = INF
        yield from self._reservations(now)
        yield from self._warm(now)
        yield from self._cold(now)
        yield from self._reservations(now)  # one made just now may already be complete
