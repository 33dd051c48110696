"""The HTTP API: one flask-smorest blueprint per resource, schemas beside it; HTTP only, the state is `control`'s."""

from __future__ import annotations

from flask_smorest import Blueprint

from . import (
    data,
    examples,
    gateway,
    health,
    models,
    nodes,
    placement,
    profiler,
    queue,
    scheduling,
    services,
    tokens,
    workflows,
)

BLUEPRINTS: tuple[Blueprint, ...] = (
    health.blp,
    nodes.blp,
    models.blp,
    services.blp,
    workflows.blp,
    examples.blp,
    queue.blp,
    profiler.blp,
    profiler.root,
    data.blp,
    scheduling.blp,
    placement.blp,
    gateway.blp,
    tokens.blp,
)
