"""`eft`: earliest finish time list scheduling, the reference rule a model-aware policy has to beat.

Each step, when it becomes ready, is committed to the GPUs where it would finish first given what is already
committed there, warm or cold: a GPU whose last committed model is the step's own starts it without a load.
"""

from __future__ import annotations

from ..cluster import Group
from .base import Committed, Driver


class Eft(Committed):
    """Commit every ready step to the GPU(s) where it would finish earliest."""

    name = "eft"

    def bind(self, sim: Driver) -> None:
        super().bind(sim)
        c = self.c
        self.plan_end = [0.0] * c.gpus
        self.plan_model: list[int | None] = [c.model_on(g) for g in range(c.gpus)]
        self.plan_group: list[Group | None] = [
            None if m is None else c.residency.held[g][m] for g, m in enumerate(self.plan_model)
        ]

    def finish_on(self, s: int, gpus: Group, ready_at: float, cold: float) -> float:
        """When `s` would end on `gpus` after what is committed there."""
        m = self.w.model[s]
        warm = all(self.plan_model[g] == m and self.plan_group[g] == gpus for g in gpus)
        start = max([ready_at, *(self.plan_end[g] for g in gpus)])
        return start + (0.0 if warm else cold) + self.w.seconds[s]

    def choose(self, s: int, ready_at: float, now: float) -> tuple[float, Group]:
        """The earliest finish over every node: its warm groups and the k GPUs committed least far ahead."""
        c, m = self.c, self.w.model[s]
        spec = self.w.models[m]
        k = spec.gpus_required
        best: tuple[float, Group] | None = None
        for node, gpus in enumerate(c.eligible[m]):
            if len(gpus) < k:
                continue
            cold = c.fleet.load_seconds(spec, c.tiers.tier(m, node, now), node)
            if k == 1:
                found = self._one_gpu(gpus, m, ready_at, cold, self.w.seconds[s])
                if found is not None and (best is None or found[0] < best[0]):
                    best = found
                continue
            warm = {self.plan_group[g] for g in gpus if self.plan_model[g] == m}
            soonest = tuple(sorted(sorted(gpus, key=lambda g: (self.plan_end[g], g))[:k]))
            for grp in [grp for grp in warm if grp is not None] + [soonest]:
                f = self.finish_on(s, grp, ready_at, cold)
                if best is None or f < best[0]:
                    best = (f, grp)
        assert best is not None, "the fleet was checked to host every model"
        return best

    def _one_gpu(
        self, gpus: list[int], m: int, ready_at: float, cold: float, seconds: float
    ) -> tuple[float, Group] | None:
        """`finish_on` for every GPU of a node for a one-GPU model, inlined: this loop is most of eft's time (every
        step looks at every GPU); the first GPU of the earliest finish wins, as in the general loop."""
        plan_end, plan_model, plan_group = self.plan_end, self.plan_model, self.plan_group
        best_f, best_g = float("inf"), -1
        for g in gpus:
            end = plan_end[g]
            start = end if end > ready_at else ready_at
            f = start + (0.0 if plan_model[g] == m and plan_group[g] == (g,) else cold) + seconds
            if f < best_f:
                best_f, best_g = f, g
        return None if best_g < 0 else (best_f, (best_g,))

    def place(self, s: int, ready_at: float, now: float) -> float:
        """Commit `s` where it finishes first; returns the planned finish."""
        finish, gpus = self.choose(s, ready_at, now)
        m = self.w.model[s]
        for g in gpus:
            self.plan_end[g] = finish
            self.plan_model[g] = m
            self.plan_group[g] = gpus
        self.commit(s, gpus)
        return finish

    def on_ready(self, s: int, now: float) -> None:
        self.place(s, now, now)
