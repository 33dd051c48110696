"""Two baselines: `fifo` (the original's valid one) and `round_robin`."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from ..cluster import Group
from .base import Committed, Decision, Driver, Policy, idle_group, lru_key


class Fifo(Policy):
    """The earliest-ready step takes idle GPUs, preferring ones that hold its model; nothing overtakes it."""

    name = "fifo"

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        self.queue: list[tuple[float, int]] = []

    def on_ready(self, s: int, now: float) -> None:
        heapq.heappush(self.queue, (now, s))

    def dispatch(self, now: float) -> Iterator[Decision]:
        key = lru_key(self.c)
        while self.queue and self.c.idle:
            s = self.queue[0][1]
            gpus = idle_group(self.c, self.w.model[s], key)
            if gpus is None:
                return  # strict FIFO: a multi-GPU step at the head waits, and nothing passes it
            heapq.heappop(self.queue)
            yield s, gpus


class RoundRobin(Committed):
    """Each ready step is committed to the next GPU(s) in turn, whatever they hold."""

    name = "round_robin"

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        self.next = 0

    def _turn(self, m: int) -> Group:
        c, k = self.c, self.w.models[m].gpus_required
        for step in range(c.gpus):
            g = (self.next + step) % c.gpus
            on_node = c.eligible[m][c.node_of[g]]
            if g in on_node and len(on_node) >= k:
                at = on_node.index(g)
                pick = tuple(sorted(on_node[(at + i) % len(on_node)] for i in range(k)))
                self.next = (max(pick) + 1) % c.gpus
                return pick
        raise AssertionError("the fleet was checked to host every model")

    def on_ready(self, s: int, now: float) -> None:
        self.commit(s, self._turn(self.w.model[s]))
