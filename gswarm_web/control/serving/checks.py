"""What a request to serve must pass before anything is written: a pinned device has a copy of the weights and a
free port, and a service's aliases name nothing else."""

from __future__ import annotations

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import Conflict, InvalidRequest

from ...extensions import db
from ...tables import Model, Service
from .state import ENDED, port_taken, serving_tier


def check_aliases(model: Model, aliases: list[str], service_id: str | None = None) -> None:
    """A service's other names must name nothing else: no registered model, no other live service's alias (409)."""
    if not aliases:
        return
    taken = set(
        db.session.scalars(db.select(Model.name).where(Model.name.in_(aliases), Model.id != model.id))
    )
    others = db.session.execute(
        db.select(Service.id, Service.config).where(
            Service.status.not_in(ENDED), Service.id != (service_id or "")
        )
    ).all()
    taken |= {a for _sid, config in others for a in (config or {}).get("aliases") or () if a in aliases}
    if taken:
        name = sorted(taken)[0]
        raise Conflict(f"config.aliases: {name!r} is already the name of a model or another service's alias",
                       {"field": "config.aliases", "alias": name})  # fmt: skip


def check_pinned(model: Model, dev: Device, port: int | None) -> str:
    """What serving on a named device needs: a copy on that node's disk or dram, and a free port."""
    tier = serving_tier(model, str(dev.node))
    if tier is None:
        raise InvalidRequest(
            f"model_name: {model.name} has no copy on {dev.node}'s disk or dram; copy it there first (or use auto)",
            {"field": "model_name", "node": dev.node},
        )
    if port is not None and port_taken(str(dev.node), port):
        raise InvalidRequest(f"port: {port} is taken by another service on {dev.node}", {"field": "port"})
    return tier
