"""A serve action's `config`: a serving preset of the node and its documented parameters (never a command), and the
keys that are the service's own, as in POST /services' config (`timeout`: seconds a replica has to answer the
gateway, `load_balancing`): those stay on the service and are never sent to the node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gswarm_tasks.errors import InvalidRequest
from gswarm_tasks.serving.engines import choose, presets


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 3600


SERVICE_OWN: dict[str, tuple[Callable[[Any], bool], str]] = {
    "timeout": (_seconds, "seconds a replica has to answer, more than 0 and at most 3600"),
    "load_balancing": (
        lambda v: v in ("least_requests", "round_robin"),
        "one of least_requests, round_robin",
    ),
}


def serve_config(raw: Any) -> tuple[dict[str, Any] | None, dict[str, Any], list[tuple[str, str]]]:
    """(`{"backend": preset, **parameters}` or None when refused, the service's own keys, [(field, problem)])."""
    from flask import has_app_context

    from ..extensions import settings

    if not isinstance(raw, dict):
        return None, {}, [("config", "must be a mapping")]
    config = dict(raw)
    own = {k: config.pop(k) for k in SERVICE_OWN if k in config}
    problems = [(f"config.{k}", SERVICE_OWN[k][1]) for k, v in own.items() if not SERVICE_OWN[k][0](v)]
    offered = presets(settings().serve_engines if has_app_context() else None)
    try:
        engine, params = choose(config, offered)
    except InvalidRequest as exc:
        problems.append((str(exc.details.get("field", "config")), exc.message.split(": ", 1)[-1]))
        return None, own, problems
    return {"backend": engine, **params}, own, problems
