"""Submitting a workflow: validate it, check it against the fleet, persist every step (one bulk insert), and
send the chains that have nothing to wait for. Nothing is created when anything is refused."""

from __future__ import annotations

import contextlib
import gc
import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NotFound
from gswarm_tasks.models.sources import parse_source
from gswarm_tasks.serving.engines import default_route
from gswarm_tasks.storage import prefix as storage_prefix

from ..control.dispatch import forget_recorded, peer_source
from ..control.nodes.placement import require_engine
from ..control.serving import state as service_state
from ..extensions import db, settings
from ..tables import Model, Node, NodeGpu, TaskRecord, WorkflowRun
from ..tables import utcnow as now
from .actions import MODEL_ACTIONS
from .chains import Sends, advance, send
from .compiler import segments, step_device, step_queue
from .data import prepare_data
from .document import Action, Workflow
from .placing import place_workflow
from .spec import validate
from .urls import allowed_origins, chosen_origins, fleet_node_hosts


@dataclass
class Plan:
    """A workflow as submission makes it: its run and step rows written in the session, not committed."""

    run: WorkflowRun
    wf: Workflow
    rows: list[dict[str, Any]]
    sends: Sends
    placements: dict[str, dict[str, Any]]


def plan(doc: dict[str, Any]) -> Plan:
    """Every check and every write of a submission, in the open transaction: validation, the fleet's nodes, the
    registry, sources, URLs, placement, chunks. Raises (422, 404, 409 naming the action and field) on the first
    thing refused; the caller commits (submit) or rolls back (validate)."""
    wf = validate(doc, settings().task_timeout_s)  # the one parse: typed from here on
    wf = wf.with_actions(fleet_node_hosts(wf.actions))
    origins = allowed_origins(wf.actions)
    nodes = {n.name: n for n in db.session.scalars(db.select(Node))}
    _register_models(wf)
    wf, placements = place_workflow(wf)
    for a in wf.actions:
        q = step_queue(a)
        if q != names.CONTROL_QUEUE and q not in nodes:
            where = (
                "node"
                if a.node == q and not step_device(a)
                else next((k for k in ("target_device", "device", "source_device") if k in a.params), "node")
            )
            raise NotFound(
                f"actions[{a.id}].{where}: node {q!r} is not registered",
                {"field": f"actions[{a.id}].{where}", "node": q},
            )
    run = WorkflowRun(
        id=str(uuid.uuid4()),
        name=wf.name,
        description=wf.description,
        status="running",
        fail_fast=wf.fail_fast,
        queue_config=wf.queue_config,
        document=doc,
        started_at=now(),
    )
    db.session.add(run)
    data_extra = prepare_data(run, wf)
    for aid, allowed in {**origins, **chosen_origins(data_extra)}.items():
        data_extra.setdefault(aid, {})["allowed_origins"] = allowed
    for aid, decisions in placements.items():
        data_extra.setdefault(aid, {})["placement"] = decisions
    rows = _step_rows(run, wf, nodes, data_extra)
    views = {r["id"]: _RowView(r) for r in rows}
    sends = advance(
        run, views
    )  # decides the first chains before the rows are written: one insert, no updates
    for r in rows:
        r["state"] = views[r["id"]].state
    _insert_steps(rows)
    return Plan(run, wf, rows, sends, placements)


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """Python's cyclic collector held off while a document is read and submitted: a 10,000-action document makes
    millions of objects, and every full pass walks all of them (a quarter of such a submission's CPU). What the
    request leaves behind is collected once it is done."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def submit(doc: dict[str, Any]) -> WorkflowRun:
    """Validate, check against the fleet, persist, and start; nothing is created when anything is refused."""
    p = plan(doc)
    db.session.commit()
    send(p.sends)
    return p.run


def check(doc: dict[str, Any]) -> dict[str, Any]:
    """What submitting `doc` would do, with every check submit runs; nothing is kept or sent."""
    try:
        p = plan(doc)
        steps = [
            {
                "action_id": r["step_id"],
                "action_type": r["kind"],
                "node": r["node"],
                "device": r["device"],
                "source_device": r["source_device"],
                "target_device": r["target_device"],
                "dependencies": r["depends_on"],
                "chain": r["segment"],
            }
            for r in p.rows
        ]
        answer = {
            "valid": True,
            "name": p.wf.name,
            "actions": len(p.wf.actions),
            "chains": len({r["segment"] for r in p.rows}),
            "steps": steps,
            "placement": p.placements,
            "warnings": _warnings(p.wf),
        }
    finally:
        db.session.rollback()
        forget_recorded()
    return answer


def _warnings(wf: Workflow) -> list[str]:
    """What will fail when it runs unless the fleet changes first: a GPU its node does not report."""
    gpus: dict[str, set[int]] = defaultdict(set)
    for node, index in db.session.execute(db.select(NodeGpu.node_name, NodeGpu.index)):
        gpus[str(node)].add(int(index))
    out = []
    for a in _in_steps(wf):
        for key, d in (("device", step_device(a)), ("target_device", a.device("target_device"))):
            if isinstance(d, Device) and d.is_gpu and d.gpu_index not in gpus.get(str(d.node), set()):
                have = sorted(gpus.get(str(d.node), set()))
                out.append(
                    f"actions[{a.id}].{key}: {d.node} reports "
                    f"{'GPUs ' + str(have) if have else 'no GPU'}; the step fails with RESOURCE_UNAVAILABLE unless "
                    f"{d} is there when it runs"
                )
    return out


def _in_steps(wf: Workflow) -> list[Action]:
    """The actions in the order their step rows are written (chain by chain)."""
    return [a for seg in segments(wf) for a in seg]


class _RowView:
    """A dict-backed stand-in for a TaskRecord during submission (rows were bulk-inserted)."""

    id: str
    state: str

    def __init__(self, row: dict[str, Any]) -> None:
        self.__dict__.update(row)


def _register_models(wf: Workflow) -> None:
    known = {m.name for m in db.session.scalars(db.select(Model))}
    downloaded = {a.text("model_name") for a in wf.actions if a.type == "download"}
    for a in wf.actions:
        name = a.text("model_name")
        if a.type not in MODEL_ACTIONS or name is None:
            continue
        if name in known:
            continue
        if a.type == "download":
            if not a.fields.get("source_url"):
                raise InvalidRequest(
                    f"actions[{a.id}].source_url: {name} is not registered, so the download needs a source_url",
                    {"field": f"actions[{a.id}].source_url"},
                )
            parse_source(a.fields["source_url"], settings().allowed_roots, f"actions[{a.id}].source_url")
            db.session.add(
                Model(
                    name=name,
                    model_type=str(a.fields.get("model_type") or "unknown"),
                    source_url=a.fields["source_url"],
                    locations=[],
                )
            )
            known.add(name)
        elif name not in downloaded:
            raise InvalidRequest(
                f"actions[{a.id}].model_name: {name} is not registered",
                {"field": f"actions[{a.id}].model_name"},
            )
    db.session.flush()


def _fanout(wf: Workflow, segs: list[list[Any]]) -> dict[str, list[str]]:
    """Per action, the dependents that start chains of their own (the dispatcher must look at them)."""
    seg_of = {a.id: n for n, seg in enumerate(segs) for a in seg}
    fanout: dict[str, list[str]] = defaultdict(list)
    for a in wf.actions:
        for d in a.deps:
            if seg_of[d] != seg_of[a.id]:
                fanout[d].append(a.id)
    return fanout


def _service_row(model: Model, dev: Device, params: dict[str, Any]) -> str:
    """The service a serve step starts (one replica on its device, `pending` until the step runs); returns the
    replica's id, which is the id the node runs it under."""
    config = {**(params.get("config") or {}), **(params.get("service_config") or {})}
    svc = service_state.create(
        model,
        str(dev),
        1,
        params.get("port"),
        str(config.get("backend", "builtin")),
        config=config,
        status="pending",
    )
    return service_state.add_replica(svc, dev, status="pending").id


def _step_params(
    a: Action, models: dict[str, Model], nodes: dict[str, Node], data_extra: dict[str, Any], ttl: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the action's parameters as its step runs them, what the step needs besides: service, source, chunks)."""
    params = dict(a.params)
    model_name = a.text("model_name")
    if a.type == "download" and not params.get("source_url") and model_name in models:
        params["source_url"] = models[model_name].source_url
    if a.type == "inference" and not params.get("endpoint") and model_name in models:
        params["endpoint"] = default_route(models[model_name].model_type)  # the route its model answers
    extra: dict[str, Any] = dict(data_extra.get(a.id) or {})
    params.update(extra.pop("params", {}))
    dev = a.device("device")
    if a.type == "serve" and model_name in models and isinstance(dev, Device):
        if str(dev.node) in nodes:  # a node that cannot run the engine is refused now, not when the step runs
            engine = str((params.get("config") or {}).get("backend") or "builtin")
            require_engine(nodes[str(dev.node)], engine, f"actions[{a.id}].config.backend")
        model = models[model_name]
        extra.update(service_id=_service_row(model, dev, params), trust_remote_code=model.trust_remote_code)
    src, dst = a.device("source_device"), a.device("target_device")
    if a.type in ("copy", "move") and isinstance(src, Device) and isinstance(dst, Device):
        if a.type == "copy" or src.node != dst.node:
            extra["source"] = _source(nodes, src, str(dst.node), str(model_name), ttl)
    return params, extra


def _step_rows(
    run: WorkflowRun, wf: Workflow, nodes: dict[str, Node], data_extra: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    s = settings()
    models = {m.name: m for m in db.session.scalars(db.select(Model))}
    ttl = min(24 * 3600, s.transfer_token_ttl_s + sum(a.timeout_s or s.task_timeout_s for a in wf.actions))
    segs = segments(wf)
    fanout = _fanout(wf, segs)
    rows = []
    for seg_no, seg in enumerate(segs):
        for pos, a in enumerate(seg):
            params, extra = _step_params(a, models, nodes, data_extra, ttl)
            rows.append(
                {
                    "id": str(uuid.uuid4()),
                    "kind": a.type,
                    "state": "pending",
                    "node": step_queue(a),
                    "priority": a.priority,
                    "model_name": a.text("model_name"),
                    "service_id": extra.get("service_id"),
                    "source_device": params.get("source_device"),
                    "target_device": params.get("target_device"),
                    "device": _text(step_device(a)),
                    "params": {
                        "params": params,
                        "retries": a.retries,
                        "retry_backoff": a.retry_backoff,
                        "timeout_s": a.timeout_s,
                        "fanout": fanout.get(a.id, []),
                        "tail": pos == len(seg) - 1,
                        **extra,
                    },
                    "workflow_id": run.id,
                    "step_id": a.id,
                    "depends_on": a.deps,
                    "segment": seg_no,
                    "position": pos,
                    "exclusive": a.exclusive,
                    "attempts": 0,
                    "dispatched": False,
                    "created_at": now(),
                }
            )
    return rows


def _insert_steps(rows: list[dict[str, Any]]) -> None:
    """The step rows, in the open transaction: on Postgres one COPY (10,000 steps: 0.1 s, where an INSERT per row
    costs a second), elsewhere one executemany."""
    db.session.flush()  # the run and what placement made first: the rows refer to them
    conn = db.session.connection()
    driver = conn.connection.driver_connection
    if conn.dialect.name != "postgresql" or driver is None or not rows:
        db.session.execute(db.insert(TaskRecord), rows)
        return
    table = TaskRecord.__table__
    cols = list(rows[0])
    # JSON columns as SQLAlchemy's JSON type writes them (None included: JSON null)
    as_json = [isinstance(table.c[c].type, db.JSON) for c in cols]
    sql = f"COPY {table.name} ({', '.join(cols)}) FROM STDIN"
    with driver.cursor() as cur, cur.copy(sql) as copy:
        for r in rows:
            copy.write_row([json.dumps(r[c]) if j else r[c] for c, j in zip(cols, as_json, strict=True)])


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _source(nodes: dict[str, Node], src: Device, dest_node: str, model: str, ttl: float) -> dict[str, Any]:
    if src.node == dest_node:
        return {"node": src.node, "tier": src.tier}
    return peer_source(nodes[str(src.node)], src.tier, storage_prefix(src.tier, "models", model), ttl)
