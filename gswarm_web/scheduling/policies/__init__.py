"""Scheduling policies behind one interface (`Policy`), by name."""

from __future__ import annotations

from typing import Any

from ..fields import choice
from .base import Policy
from .eft import Eft
from .gswarm import Gswarm
from .original import OfflineBatch, OnlineCost
from .simple import Fifo, RoundRobin

# `eft` is a reference for benchmarks, not offered on the command line.
POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (Fifo, RoundRobin, OfflineBatch, OnlineCost, Gswarm, Eft)
}
PUBLIC_POLICIES = ("fifo", "round_robin", "offline", "online", "gswarm")
DEFAULT_POLICY = "gswarm"


def make_policy(name: str, field: str = "policy", **options: Any) -> Policy:
    """A fresh policy by name (`eft` included), refusing unknown names naming `field`."""
    return POLICIES[choice(name, field, tuple(POLICIES))](**options)
