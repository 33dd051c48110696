"""A service's config: the keys that are the service's own (port, replicas, load balancing, timeout, max in flight,
its nodes, its aliases), checked where a service is made or changed, and the rest: its serving preset's parameters,
which go to the node."""

from __future__ import annotations

import re
from typing import Any

from gswarm_tasks.errors import InvalidRequest

LOAD_BALANCING = ("least_requests", "round_robin")
# A service's `config` keys that are the service's own (the original's), not its serving preset's parameters;
# `nodes` is kept there too (the nodes a service is pinned to) and never sent to a node.
SERVICE_KEYS = ("port", "replicas", "load_balancing", "timeout", "max_in_flight", "nodes", "aliases")
ALIAS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")


def split_config(config: dict[str, Any], field_: str = "config") -> tuple[dict[str, Any], dict[str, Any]]:
    """(the preset's parameters, the service's own keys, checked): `port`, `replicas`, `load_balancing` (one of
    LOAD_BALANCING), `timeout` (seconds a replica has to answer) and `max_in_flight` (requests a replica takes at
    once) are the service's; 422 naming the field."""
    engine = {k: v for k, v in config.items() if k not in SERVICE_KEYS}
    own = {k: config[k] for k in SERVICE_KEYS if k in config}
    if "nodes" in own:
        raise InvalidRequest(
            f"{field_}.nodes: give `nodes` beside `config`, not in it", {"field": f"{field_}.nodes"}
        )
    checks = {
        "port": (lambda v: _int(v) and 1024 <= v <= 65535, "an integer from 1024 to 65535"),
        "replicas": (lambda v: _int(v) and 1 <= v <= 64, "an integer from 1 to 64"),
        "load_balancing": (lambda v: v in LOAD_BALANCING, f"one of {', '.join(LOAD_BALANCING)}"),
        "timeout": (lambda v: _number(v) and 0 < v <= 3600, "seconds, more than 0 and at most 3600"),
        "max_in_flight": (lambda v: _int(v) and 1 <= v <= 100_000, "an integer from 1 to 100000"),
        "aliases": (
            lambda v: (
                isinstance(v, list)
                and len(v) <= 16
                and all(isinstance(a, str) and ALIAS_RE.match(a) for a in v)
            ),
            "a list of at most 16 other names the service answers to (e.g. text-embedding-3-small)",
        ),
    }
    for key, value in own.items():
        ok, what = checks[key]
        if not ok(value):
            raise InvalidRequest(f"{field_}.{key}: {what}", {"field": f"{field_}.{key}"})
    return engine, own


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def engine_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """What a node's serving preset gets of a service's config: its parameters only."""
    return {k: v for k, v in (config or {}).items() if k not in SERVICE_KEYS}
