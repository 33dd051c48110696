"""What submission fixes for a workflow's data actions.

Every action that makes a chunk gets its chunk id, chunks named literally are looked up (they must exist, and the
workflow holds a reference on them while it runs), and an inference that names only a model is pointed at its
service. What a data step made is recorded by `control.chunk_state.record_step_chunk`.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

from gswarm_tasks.data.sources import parse_data_source
from gswarm_tasks.errors import InvalidRequest, NotFound

from ..control.data.state import hold, location_view, usable_locations
from ..extensions import db, settings
from ..tables import DataChunk, Model, Replica, Service, WorkflowRun
from .actions import CHUNK_FIELDS
from .document import Workflow
from .spec import first_serves

PRODUCERS = ("data_create", "inference", "data_merge")


def prepare_data(run: WorkflowRun, wf: Workflow) -> dict[str, dict[str, Any]]:
    """Per action id: extra step parameters (`chunk_id`, `chunks`, rewritten `params`). Refuses, naming the
    field, a chunk that does not exist, a source that is not allowed, or an inference with no service."""
    s = settings()
    serves = first_serves(wf)
    out: dict[str, dict[str, Any]] = {}
    for a in wf.actions:
        extra: dict[str, Any] = {}
        where = f"actions[{a.id}]"
        p = a.fields
        if a.type in PRODUCERS:
            extra["chunk_id"] = str(uuid.uuid4())
        if a.type == "data_create":
            if isinstance(p.get("source"), str) and "${" not in p["source"]:
                parse_data_source(p["source"], s, f"{where}.source")
            elif p.get("data") is not None:
                try:
                    raw = base64.b64decode(str(p["data"]), validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise InvalidRequest(
                        f"{where}.data: not valid base64", {"field": f"{where}.data"}
                    ) from exc
                if len(raw) > s.data_max_inline:
                    raise InvalidRequest(
                        f"{where}.data: more than {s.data_max_inline} bytes; use `source`",
                        {"field": f"{where}.data"},
                    )
        # A chunk named by id (a reference was parsed into a `Ref` at the edge).
        literal = [(f"{where}.{key}", p[key]) for key in CHUNK_FIELDS if isinstance(p.get(key), str)]
        literal += [
            (f"{where}.inputs[{i}]", c) for i, c in enumerate(p.get("inputs") or []) if isinstance(c, str)
        ]
        chunks: dict[str, list[dict[str, Any]]] = {}
        for field, cid in literal:
            chunk = db.session.get(DataChunk, cid) if len(cid) <= 36 else None
            if chunk is None:
                raise NotFound(f"{field}: no data chunk {cid!r}", {"field": field, "chunk_id": cid})
            locs = usable_locations(chunk)
            if chunk.status != "available" or not locs:
                raise InvalidRequest(
                    f"{field}: chunk {cid} has no available copy (it is {chunk.status})", {"field": field}
                )
            chunks[cid] = [location_view(chunk, loc) for loc in locs]
            hold(chunk, run.id)
        if chunks:
            extra["chunks"] = chunks
        if a.type == "inference" and not p.get("service_url") and not p.get("service"):
            extra["params"] = {
                "service_url": _service_for(a.id, str(p["model_name"]), serves.get(a.id), where)
            }
        if extra:
            out[a.id] = extra
    return out


def _service_for(aid: str, model: str, serve: str | None, where: str) -> str:
    """An inference that names a model uses a serve action of it it depends on, else a running service."""
    if serve is not None:
        return f"${{{serve}.service_url}}"
    svc = db.session.scalar(
        db.select(Replica)
        .join(Service)
        .join(Model, Service.model_id == Model.id)
        .where(Replica.status == "running", Replica.url.is_not(None), Model.name == model)
        .order_by(Replica.started_at.desc())
    )
    if svc is None or not svc.url:
        raise InvalidRequest(
            f"{where}.model_name: no running service of {model}, and no serve action of it before {aid}",
            {"field": f"{where}.model_name", "model": model},
        )
    return str(svc.url)
