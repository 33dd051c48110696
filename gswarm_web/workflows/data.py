"""The data half of workflows: what submission fixes for data actions, and what their results record.

At submission every action that makes a chunk gets its chunk id, chunks named literally are looked up (they
must exist, and the workflow holds a reference on them while it runs), and an inference that names only a
model is pointed at its service. When a step succeeds its chunk and location are recorded, with the
workflow's reference on it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import uuid
from collections.abc import Callable
from typing import Any

from flask import current_app

from gswarm_tasks.data_tasks import parse_data_source
from gswarm_tasks.errors import InvalidRequest, NotFound

from ..data_pool import (
    _drop,
    _upsert,
    delete_copy,
    enforce_dram_capacity,
    location_view,
    touch,
    usable_locations,
)
from ..extensions import db
from ..models import ChunkLocation, ChunkRef, DataChunk, Model, Service, WorkflowRun
from .spec import CHUNK_FIELDS, REF_RE, Workflow, _ancestors

log = logging.getLogger(__name__)
PRODUCERS = ("data_create", "inference", "data_merge")


def _holder(run_id: str) -> str:
    return f"workflow:{run_id}"


def _hold(run_id: str, chunk: DataChunk) -> None:
    holder = _holder(run_id)
    if not any(r.holder == holder for r in chunk.refs) and db.session.get(ChunkRef, (chunk.id, holder)) is None:
        chunk.refs.append(ChunkRef(chunk_id=chunk.id, holder=holder, kind="workflow", workflow_id=run_id))


def prepare_data(run: WorkflowRun, wf: Workflow) -> dict[str, dict[str, Any]]:
    """Per action id: extra step parameters (`chunk_id`, `chunks`, rewritten `params`). Refuses, naming the
    field, a chunk that does not exist, a source that is not allowed, or an inference with no service."""
    settings = current_app.config["GSWARM_SETTINGS"]
    anc = _ancestors(wf.by_id())
    out: dict[str, dict[str, Any]] = {}
    for a in wf.actions:
        extra: dict[str, Any] = {}
        where = f"actions[{a.id}]"
        p = a.params
        if a.type in PRODUCERS:
            extra["chunk_id"] = str(uuid.uuid4())
        if a.type == "data_create":
            if isinstance(p.get("source"), str) and "${" not in p["source"]:
                parse_data_source(p["source"], settings, f"{where}.source")
            elif p.get("data") is not None:
                try:
                    raw = base64.b64decode(str(p["data"]), validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise InvalidRequest(f"{where}.data: not valid base64", {"field": f"{where}.data"}) from exc
                if len(raw) > settings.data_max_inline:
                    raise InvalidRequest(
                        f"{where}.data: more than {settings.data_max_inline} bytes; use `source`",
                        {"field": f"{where}.data"},
                    )
        literal: list[tuple[str, str]] = []
        for key in CHUNK_FIELDS:
            if isinstance(p.get(key), str) and not REF_RE.search(p[key]):
                literal.append((f"{where}.{key}", p[key]))
        for i, item in enumerate(p.get("inputs") or []):
            if isinstance(item, str) and not REF_RE.search(item):
                literal.append((f"{where}.inputs[{i}]", item))
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
            _hold(run.id, chunk)
        if chunks:
            extra["chunks"] = chunks
        if a.type == "inference" and not p.get("service_url") and not p.get("service"):
            extra["params"] = {"service_url": _service_for(wf, a.id, str(p["model_name"]), anc[a.id], where)}
        if extra:
            out[a.id] = extra
    return out


def _service_for(wf: Workflow, aid: str, model: str, ancestors: set[str], where: str) -> str:
    """An inference that names a model uses a serve action of it it depends on, else a running service."""
    for b in wf.actions:
        if b.type == "serve" and b.params.get("model_name") == model and b.id in ancestors:
            return f"${{{b.id}.service_url}}"
    svc = db.session.scalar(
        db.select(Service)
        .join(Model, Service.model_id == Model.id)
        .where(Service.status == "running", Service.url.is_not(None), Model.name == model)
        .order_by(Service.started_at.desc())
    )
    if svc is None or not svc.url:
        raise InvalidRequest(
            f"{where}.model_name: no running service of {model}, and no serve action of it before {aid}",
            {"field": f"{where}.model_name", "model": model},
        )
    return str(svc.url)


def record_step_data(step: Any, outputs: dict[str, Any], after: list[Callable[[], Any]]) -> None:
    """A data step succeeded: record its chunk (made here, or a new copy), the chunks it read, and the
    workflow's reference on them. Removals of other nodes' copies and eviction run after the commit."""
    cid = outputs.get("chunk_id")
    if not cid or not outputs.get("device"):
        return
    params = dict((step.params or {}).get("params") or {})
    chunk = db.session.get(DataChunk, cid)
    if chunk is None:
        default_type = "input" if step.kind == "data_create" else "intermediate"
        chunk = DataChunk(
            id=cid,
            chunk_type=str(params.get("data_type") or default_type),
            format=outputs.get("format") or params.get("format"),
            meta=dict(params.get("metadata") or {}),
            status="available",
            created_by=f"workflow:{step.workflow_id}/{step.step_id}",
            locations=[],
            refs=[],
        )
        db.session.add(chunk)
    loc = _upsert(chunk, outputs)
    if step.workflow_id:
        _hold(str(step.workflow_id), chunk)
    if outputs.get("source_removed") and outputs.get("source_device"):
        _drop(chunk, str(outputs["source_device"]))
    elif step.kind == "data_transfer" and outputs.get("delete_source") and outputs.get("source_device"):
        device = str(outputs["source_device"])

        def remove_source(chunk_id: str = chunk.id, device: str = device) -> None:
            c = db.session.get(DataChunk, chunk_id)
            src = db.session.get(ChunkLocation, (chunk_id, device))
            if c is not None and src is not None:
                delete_copy(c, src, "transfer with delete_source")

        after.append(remove_source)
    read = [str(x) for x in outputs.get("inputs") or [] if isinstance(x, str)]
    for rid in read:
        other = db.session.get(DataChunk, rid)
        if other is not None and step.workflow_id:
            _hold(str(step.workflow_id), other)
    if read:
        touch(read)
    if loc.tier == "dram":
        node = loc.node
        after.append(lambda: enforce_dram_capacity([node]))


def after_commit(after: list[Callable[[], Any]]) -> None:
    """Run what must not share the events' transaction (it sends tasks and commits); one failure does not stop
    the rest."""
    for fn in after:
        try:
            fn()
            db.session.commit()
        except Exception:
            db.session.rollback()
            log.exception("data bookkeeping after a step failed")
