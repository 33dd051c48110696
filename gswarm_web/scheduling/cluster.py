"""The fleet's state while a schedule runs: who is busy, what each GPU holds, and which tier holds which weights.

The simulator mutates it; policies read it (and ask it what a load would cost) to decide. The validator replays
GPU residency with the same `Residency` so that "warm" means the same thing in both.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import ModelSpec
from .fleet import GB, Fleet

Group = tuple[int, ...]


class Residency:
    """The models each GPU holds, as (model -> GPU group it was loaded across), oldest use first.

    `holders` lists, per model, the GPUs holding it; a multi-GPU model is held by whole groups only.
    """

    def __init__(self, fleet: Fleet, models: list[ModelSpec]) -> None:
        self.one_model = fleet.capacity == "one_model"
        self.memory = fleet.gpu_memory_bytes
        self.share = [m.memory_gb * GB / m.gpus_required for m in models]
        self.held: list[dict[int, Group]] = [{} for _ in fleet.gpu_node]
        self.used = [0.0] * fleet.gpus
        self.holders: list[set[int]] = [set() for _ in models]

    def warm(self, m: int, gpus: Group) -> bool:
        """Whether every GPU of `gpus` holds `m` from a load across exactly these GPUs (shards match)."""
        return all(self.held[g].get(m) == gpus for g in gpus)

    def model_on(self, g: int) -> int | None:
        """The most recently used model on GPU `g`."""
        held = self.held[g]
        return next(reversed(held)) if held else None

    def use(self, m: int, gpus: Group) -> None:
        """Mark `m` most recently used on `gpus` (the eviction order of the `memory` rule)."""
        for g in gpus:
            grp = self.held[g].pop(m)
            self.held[g][m] = grp

    def load(self, m: int, gpus: Group) -> None:
        """Put `m` on `gpus`, evicting what the capacity rule says must go."""
        for g in gpus:
            held = self.held[g]
            if m in held:
                self._evict(g, m)
            while held and (self.one_model or self.used[g] + self.share[m] > self.memory[g]):
                self._evict(g, next(iter(held)))
            held[m] = gpus
            self.used[g] += self.share[m]
            self.holders[m].add(g)

    def _evict(self, g: int, m: int) -> None:
        # A shard is useless without the others, so a multi-GPU model leaves every GPU of its group at once.
        group = self.held[g][m]
        for x in group:
            if self.held[x].get(m) == group:
                del self.held[x][m]
                self.used[x] -= self.share[m]
                self.holders[m].discard(x)


def seed_residency(
    fleet: Fleet, models: list[ModelSpec], model_index: dict[str, int], residency: Residency
) -> None:
    """What the fleet says is resident on GPUs at the start, grouped by the model's GPUs per instance, node by node."""
    for name, places in fleet.weights.items():
        m = model_index.get(name)
        if m is None:
            continue
        k = models[m].gpus_required
        for node in range(len(fleet.node_names)):
            on = [g for n, t, g in places if t == "gpu" and n == node]
            for i in range(0, len(on) - k + 1, k):
                residency.load(m, tuple(sorted(on[i : i + k])))


class Tiers:
    """Which node has which weights in DRAM (an LRU cache of `dram_gb`) and on disk, and from when."""

    def __init__(self, fleet: Fleet, models: list[ModelSpec]) -> None:
        self.fleet = fleet
        self.size = [fleet.model_bytes(m) for m in models]
        nodes = len(fleet.node_names)
        self.dram: list[dict[int, float]] = [{} for _ in range(nodes)]
        self.dram_used = [0.0] * nodes
        self.disk: list[dict[int, float]] = [{} for _ in range(nodes)]

    def tier(self, m: int, node: int, now: float) -> str:
        """The fastest tier `m` can come from onto a GPU of `node` at `now` (its GPU holder excepted)."""
        if self.fleet.uniform:
            return "config"
        if self.dram[node].get(m, now + 1) <= now:
            return "dram"
        if self.disk[node].get(m, now + 1) <= now:
            return "disk"
        for other, disk in enumerate(self.disk):
            if other != node and disk.get(m, now + 1) <= now:
                return "peer"
        return "hub"

    def arrive(self, m: int, node: int, at: float) -> None:
        """Weights passing through `node` on their way to a GPU stay on its disk and, if they fit, in its DRAM."""
        self.disk[node].setdefault(m, at)
        cache, cap = self.dram[node], self.fleet.dram_bytes[node]
        if m in cache:
            cache[m] = min(cache.pop(m), at)
            return
        if self.size[m] > cap:
            return
        while cache and self.dram_used[node] + self.size[m] > cap:
            old = next(iter(cache))
            del cache[old]
            self.dram_used[node] -= self.size[old]
        cache[m] = at
        self.dram_used[node] += self.size[m]


class Cluster:
    """Busy/idle GPUs, residency and tiers; what policies see and the simulator changes."""

    def __init__(self, fleet: Fleet, models: list[ModelSpec], model_index: dict[str, int]) -> None:
        self.fleet = fleet
        self.models = models
        self.gpus = fleet.gpus
        self.node_of = fleet.gpu_node
        self.node_gpus = fleet.node_gpus()
        self.free_at = [0.0] * self.gpus
        self.idle: set[int] = set(range(self.gpus))
        self.residency = Residency(fleet, models)
        self.tiers = Tiers(fleet, models)
        # per model, per node: the GPUs whose memory can take its share
        self.eligible: list[list[list[int]]] = [
            [[g for g in gs if fleet.gpu_memory_bytes[g] >= self.residency.share[m]] for gs in self.node_gpus]
            for m in range(len(models))
        ]
        self.eligible_sets = [
            [set(gs) for gs in nodes] for nodes in self.eligible
        ]  # the same, for membership
        self._initial(model_index)

    def _initial(self, model_index: dict[str, int]) -> None:
        for name, places in self.fleet.weights.items():
            m = model_index.get(name)
            if m is None:
                continue
            for node, tier, _ in places:
                # Weights resident on a GPU came through that node, so its disk has them too.
                self.tiers.disk[node].setdefault(m, float("-inf"))
                if tier == "dram":
                    self.tiers.arrive(m, node, float("-inf"))
        seed_residency(self.fleet, self.models, model_index, self.residency)

    def warm(self, m: int, gpus: Group) -> bool:
        """Whether `m` can start on `gpus` without a load."""
        return self.residency.warm(m, gpus)

    def holders(self, m: int) -> set[int]:
        """GPUs holding `m` (any group)."""
        return self.residency.holders[m]

    def model_on(self, g: int) -> int | None:
        """The model GPU `g` last used (None when empty)."""
        return self.residency.model_on(g)

    def load_estimate(self, m: int, gpus: Sequence[int], now: float) -> tuple[float, str]:
        """Seconds and tier of bringing `m` onto `gpus` if it started now (0 and `gpu` when warm)."""
        group = tuple(gpus)
        if self.residency.warm(m, group):
            return 0.0, "gpu"
        node = self.node_of[group[0]]
        tier = self.tiers.tier(m, node, now)
        return self.fleet.load_seconds(self.models[m], tier, node), tier

    def occupy(self, m: int, gpus: Group, now: float, seconds: float) -> tuple[float, str]:
        """Start `m` on idle `gpus` at `now` for `seconds` of work: returns the load's seconds and tier."""
        load, tier = self.load_estimate(m, gpus, now)
        if tier == "gpu":
            self.residency.use(m, gpus)
        else:
            self.residency.load(m, gpus)
            if tier != "config":
                self.tiers.arrive(m, self.node_of[gpus[0]], now + load)
        end = now + load + seconds
        for g in gpus:
            self.idle.discard(g)
            self.free_at[g] = end
        return load, tier

    def idle_on(self, m: int, node: int) -> list[int]:
        """The idle GPUs of `node` that can take `m`, in index order (walking the idle ones when they are fewer)."""
        eligible = self.eligible[m][node]
        if len(self.idle) < len(eligible):
            allowed = self.eligible_sets[m][node]
            return sorted(g for g in self.idle if g in allowed)
        return [g for g in eligible if g in self.idle]

    def release(self, gpus: Sequence[int]) -> None:
        """The step on `gpus` ended."""
        self.idle.update(gpus)
