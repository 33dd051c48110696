"""Submitting, advancing and cancelling workflows: the dispatcher.

Submission validates, persists every step (state `pending`) and sends the chains whose first step has
nothing to wait for. Steps report into the `gswarm:steps` stream; `apply_step_events` (run by the
control worker's stream consumer, batched) records their states and outputs, skips the dependents of a
failed step, sends each chain whose first step became ready, and ends the workflow. Sending is an outbox:
a step is marked `queued` in the same transaction that decides to send it, and `dispatched` after the
broker took it, so a crash in between is repaired by `resend_undispatched`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import chain
from flask import current_app

from gswarm_tasks import defaults
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest, NotFound
from gswarm_tasks.workflow_tasks import CANCEL_TASK_KEY, CANCEL_WF_KEY, KEEP_S, SPECS_KEY

from ..extensions import db
from ..health import redis_client
from ..models import Model, Node, Service, TaskRecord, WorkflowRun
from ..operations import peer_source, record_model_result, sender
from .compiler import segments, step_device, step_queue
from .data import after_commit, prepare_data, record_step_data
from .spec import DATA_ACTIONS, Workflow, validate

log = logging.getLogger(__name__)

TERMINAL = ("succeeded", "failed", "cancelled", "skipped")
BAD = ("failed", "cancelled", "skipped")


def now() -> datetime:
    return datetime.now(UTC)


# ---- submission ---------------------------------------------------------------------------------------------


def submit(doc: dict[str, Any]) -> WorkflowRun:
    """Validate, check against the fleet, persist, and start; nothing is created when anything is refused."""
    settings = current_app.config["GSWARM_SETTINGS"]
    wf = validate(doc, settings.task_timeout_s)
    nodes = {n.name: n for n in db.session.scalars(db.select(Node))}
    for a in wf.actions:
        q = step_queue(a)
        if q != defaults.CONTROL_QUEUE and q not in nodes:
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
    _register_models(wf)
    data_extra = prepare_data(run, wf)
    rows = _step_rows(run, wf, nodes, data_extra)
    views = {r["id"]: _RowView(r) for r in rows}
    sends = _advance(run, views)  # decides the first chains before the rows are written: one insert, no updates
    for r in rows:
        r["state"] = views[r["id"]].state
    db.session.execute(db.insert(TaskRecord), rows)
    db.session.commit()
    _send(sends)
    return run


class _RowView:
    """A dict-backed stand-in for a TaskRecord during submission (rows were bulk-inserted)."""

    id: str
    state: str

    def __init__(self, row: dict[str, Any]) -> None:
        self.__dict__.update(row)


def _register_models(wf: Workflow) -> None:
    known = {m.name for m in db.session.scalars(db.select(Model))}
    for a in wf.actions:
        name = a.params.get("model_name")
        if a.type not in ("download", "move", "copy", "delete", "serve", "stop_serve") or not isinstance(name, str):
            continue
        if name in known:
            continue
        if a.type == "download":
            if not a.params.get("source_url"):
                raise InvalidRequest(
                    f"actions[{a.id}].source_url: {name} is not registered, so the download needs a source_url",
                    {"field": f"actions[{a.id}].source_url"},
                )
            from gswarm_tasks.sources import parse_source

            parse_source(
                a.params["source_url"],
                current_app.config["GSWARM_SETTINGS"].allowed_roots,
                f"actions[{a.id}].source_url",
            )
            db.session.add(
                Model(
                    name=name,
                    model_type=str(a.params.get("model_type") or "unknown"),
                    source_url=a.params["source_url"],
                    locations=[],
                )
            )
            known.add(name)
        elif not any(b.type == "download" and b.params.get("model_name") == name for b in wf.actions):
            raise InvalidRequest(
                f"actions[{a.id}].model_name: {name} is not registered", {"field": f"actions[{a.id}].model_name"}
            )
    db.session.flush()


def _step_rows(
    run: WorkflowRun, wf: Workflow, nodes: dict[str, Node], data_extra: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    settings = current_app.config["GSWARM_SETTINGS"]
    models = {m.name: m for m in db.session.scalars(db.select(Model))}
    rows = []
    ttl = min(
        24 * 3600, settings.transfer_token_ttl_s + sum(a.timeout_s or settings.task_timeout_s for a in wf.actions)
    )
    segs = segments(wf)
    seg_of = {a.id: n for n, seg in enumerate(segs) for a in seg}
    fanout: dict[str, list[str]] = defaultdict(list)
    for a in wf.actions:
        for d in a.deps:
            if seg_of[d] != seg_of[a.id]:
                fanout[d].append(a.id)
    for seg_no, seg in enumerate(segs):
        for pos, a in enumerate(seg):
            tid = str(uuid.uuid4())
            params = dict(a.params)
            model_name = params.get("model_name") if isinstance(params.get("model_name"), str) else None
            if a.type == "download" and not params.get("source_url") and model_name in models:
                params["source_url"] = models[model_name].source_url
            extra: dict[str, Any] = dict(data_extra.get(a.id) or {})
            params.update(extra.pop("params", {}))
            if a.type == "serve" and model_name in models:
                sid = str(uuid.uuid4())
                dev = Device.parse(params["device"])
                db.session.add(
                    Service(
                        id=sid,
                        model_id=models[model_name].id,
                        node=str(dev.node),
                        device=str(dev),
                        port=params.get("port"),
                        backend=str((params.get("config") or {}).get("backend", "builtin")),
                        config=params.get("config") or {},
                        status="pending",
                    )
                )
                extra.update(service_id=sid, trust_remote_code=models[model_name].trust_remote_code)
            if a.type in ("copy", "move") and "${" not in str(params.get("source_device")):
                src, dst = Device.parse(params["source_device"]), Device.parse(params["target_device"])
                if a.type == "copy" or src.node != dst.node:
                    extra["source"] = _source(nodes, src, str(dst.node), str(model_name), ttl)
            rows.append(
                {
                    "id": tid,
                    "kind": a.type,
                    "state": "pending",
                    "node": step_queue(a),
                    "priority": a.priority,
                    "model_name": model_name,
                    "service_id": extra.get("service_id"),
                    "source_device": params.get("source_device"),
                    "target_device": params.get("target_device"),
                    "device": step_device(a),
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


def _source(nodes: dict[str, Node], src: Device, dest_node: str, model: str, ttl: float) -> dict[str, Any]:
    if src.node == dest_node:
        return {"node": src.node, "tier": src.tier}
    return peer_source(nodes[str(src.node)], src.tier, f"{src.tier}/models/{model}", ttl)


# ---- the dispatcher -----------------------------------------------------------------------------------------


def _spec(run_id: str, step: Any) -> dict[str, Any]:
    p = dict(step.params)
    return {
        "task_id": step.id,
        "workflow_id": run_id,
        "step_id": step.step_id,
        "action_type": step.kind,
        "params": p["params"],
        "retries": p.get("retries", 0),
        "retry_backoff": p.get("retry_backoff", 1.0),
        "exclusive": step.exclusive or [],
        "service_id": p.get("service_id"),
        "source": p.get("source"),
        "trust_remote_code": p.get("trust_remote_code", False),
        "chunk_id": p.get("chunk_id"),
        "chunks": p.get("chunks"),
    }


def _signature(app: Any, run_id: str, step: Any) -> Any:
    from gswarm_tasks.celery_app import priority_value

    opts: dict[str, Any] = {
        "queue": step.node,
        "routing_key": step.node,
        "task_id": step.id,
        "priority": priority_value(step.priority),
    }
    timeout = step.params.get("timeout_s")
    if timeout:
        opts.update(soft_time_limit=float(timeout), time_limit=float(timeout) + 10)
    # The message carries ids only; the step's full spec waits in Redis (a chain message carries every later
    # signature of the chain, so small ones keep a long chain from costing O(n^2) in serialization).
    ref = {"task_id": step.id, "workflow_id": run_id, "step_id": step.step_id}
    return app.signature("gswarm.node.workflow.step", args=(ref,), immutable=True, **opts)


def _advance(run: WorkflowRun, steps: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """Skip what can no longer run, pick the chains that may start now, and end the workflow when it is done.

    Returns the chains to send (after the caller commits)."""
    by_step = {s.step_id: s for s in steps.values()}
    changed = True
    while changed:  # skipping propagates down the DAG
        changed = False
        for s in steps.values():
            # A queued step behind a failed one in its chain never runs either: Celery stops the chain.
            if s.state in ("pending", "queued") and any(by_step[d].state in BAD for d in s.depends_on or []):
                s.state, s.finished_at = "skipped", now()
                changed = True
    sends: list[tuple[str, list[Any]]] = []
    if run.status == "running":
        by_segment: dict[int, list[Any]] = defaultdict(list)
        for s in steps.values():
            by_segment[int(s.segment or 0)].append(s)
        limit = int((run.queue_config or {}).get("max_concurrent_tasks") or 0)
        active = sum(1 for seg in by_segment.values() if any(x.state in ("queued", "running") for x in seg))
        for seg_no in sorted(by_segment):
            seg = sorted(by_segment[seg_no], key=lambda x: x.position or 0)
            head = seg[0]
            if head.state != "pending" or any(by_step[d].state != "succeeded" for d in head.depends_on or []):
                continue
            if limit and active >= limit:
                break
            for s in seg:
                s.state = "queued"
            sends.append((run.id, seg))
            active += 1
    states = {s.state for s in steps.values()}
    if run.status == "running" and states <= set(TERMINAL):
        if states == {"succeeded"}:
            run.status = "succeeded"
        elif "failed" in states or "cancelled" not in states:
            run.status = "failed"
        else:
            run.status = "cancelled"  # a step was cancelled and none failed
        run.finished_at = now()
    return sends


def _send(sends: list[tuple[str, list[Any]]]) -> None:
    if not sends:
        return
    app = sender()
    sent: list[str] = []
    pipe = redis_client().pipeline(transaction=False)
    for run_id, seg in sends:
        for s in seg:
            pipe.hset(SPECS_KEY.format(run_id), s.id, json.dumps(_spec(run_id, s)))
        pipe.expire(SPECS_KEY.format(run_id), KEEP_S)
    pipe.execute()
    try:
        with app.producer_or_acquire() as producer:
            for run_id, seg in sends:
                sigs = [_signature(app, run_id, s) for s in seg]
                canvas = sigs[0] if len(sigs) == 1 else chain(*sigs, app=app)
                canvas.apply_async(producer=producer)
                sent.extend(s.id for s in seg)
    finally:
        if sent:
            db.session.execute(db.update(TaskRecord).where(TaskRecord.id.in_(sent)).values(dispatched=True))
            db.session.commit()


def resend_undispatched(older_than_s: float = 5.0) -> int:
    """Send again what was decided but never reached the broker (a crash between commit and send)."""
    cutoff = now() - timedelta(seconds=older_than_s)
    rows = list(
        db.session.scalars(
            db.select(TaskRecord).where(
                TaskRecord.workflow_id.is_not(None),
                TaskRecord.state == "queued",
                TaskRecord.dispatched.is_(False),
                TaskRecord.created_at < cutoff,
            )
        )
    )
    by_seg: dict[tuple[str, int], list[TaskRecord]] = defaultdict(list)
    for r in rows:
        by_seg[(str(r.workflow_id), int(r.segment or 0))].append(r)
    sends = [(wf, sorted(seg, key=lambda x: x.position or 0)) for (wf, _), seg in by_seg.items()]
    _send(sends)
    return len(rows)


def apply_step_events(entries: list[tuple[Any, dict[Any, Any]]]) -> None:
    """Apply a batch of step reports; one transaction for the batch, then send what became ready."""
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _eid, fields in entries:
        try:
            f = {
                (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in fields.items()
            }
            events[f["workflow_id"]].append(
                {"task_id": f["task_id"], "event": f["event"], "data": json.loads(f["data"]), "time": float(f["time"])}
            )
        except (KeyError, ValueError) as exc:
            log.warning("dropping malformed step event: %s", exc)
    sends: list[tuple[str, list[Any]]] = []
    after: list[Any] = []
    for wf_id, evs in events.items():
        run = db.session.get(WorkflowRun, wf_id, with_for_update=True)
        if run is None:
            continue
        # Only the reporting steps are loaded; the whole workflow only when something may change beyond them.
        touched = {
            s.id: s
            for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.id.in_({ev["task_id"] for ev in evs})))
        }
        failed = full = ended = False
        limit = bool((run.queue_config or {}).get("max_concurrent_tasks"))
        for ev in evs:
            s = touched.get(ev["task_id"])
            if s is None:
                continue
            before = s.state
            failed |= _apply(s, ev, after)
            if s.state != before and s.state in TERMINAL:
                ended = True
                p = s.params or {}
                full |= s.state != "succeeded" or bool(p.get("fanout")) or (limit and bool(p.get("tail")))
        if failed and run.fail_fast and run.status == "running":
            cancel_workflow(run, None, reason="fail_fast: a step failed")
            full = True
        if not full and ended:
            db.session.flush()
            left = db.session.scalar(
                db.select(db.func.count())
                .select_from(TaskRecord)
                .where(TaskRecord.workflow_id == wf_id, TaskRecord.state.not_in(TERMINAL))
            )
            full = not left
        if full:
            db.session.flush()
            steps = {s.id: s for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == wf_id))}
            sends.extend(_advance(run, steps))
    db.session.commit()
    _send(sends)
    after_commit(after)


def _at(value: Any) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if isinstance(value, int | float) else None


def _apply(s: TaskRecord, ev: dict[str, Any], after: list[Any] | None = None) -> bool:
    """One event on one step; terminal states are final. Returns True when the step failed now."""
    event, data = ev["event"], ev["data"]
    at = datetime.fromtimestamp(ev["time"], UTC)
    if s.state in TERMINAL:
        return False
    if event == "started":
        s.state, s.started_at = "running", s.started_at or at
        s.attempts = max(s.attempts or 0, int(data.get("attempt") or 1))
    elif event == "retrying":
        s.error = data.get("error")
        s.attempts = max(s.attempts or 0, int(data.get("attempt") or 1))
    elif event == "succeeded":
        outputs = dict(data.get("outputs") or {})
        s.state, s.finished_at, s.error = "succeeded", at, None
        s.started_at = s.started_at or _at(data.get("started_at")) or at
        s.attempts = max(s.attempts or 0, int(data.get("attempt") or 1))
        s.outputs = {k: v for k, v in outputs.items() if k != "manifest"}
        s.result = s.outputs
        if s.kind in ("download", "copy", "move", "delete", "serve", "stop_serve"):
            record_model_result(s, outputs)
        elif s.kind in DATA_ACTIONS:
            record_step_data(s, outputs, after if after is not None else [])
    elif event == "failed":
        s.state, s.finished_at, s.error = "failed", at, data.get("error")
        s.attempts = max(s.attempts or 0, int(data.get("attempt") or 1))
        if s.kind == "serve" and s.service_id:
            svc = db.session.get(Service, s.service_id)
            if svc is not None:
                svc.status, svc.status_message = "failed", (s.error or {}).get("message")
        return True
    elif event == "cancelled":
        s.state, s.finished_at = "cancelled", at
    return False


# ---- cancel -------------------------------------------------------------------------------------------------


def cancel_workflow(run: WorkflowRun, steps: dict[str, TaskRecord] | None = None, reason: str = "cancelled") -> None:
    """Pending steps never start, running ones are stopped; the mark lives in Redis, so it survives restarts."""
    redis_client().set(CANCEL_WF_KEY.format(run.id), reason, ex=KEEP_S)
    if steps is None:
        steps = {s.id: s for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == run.id))}
    running = []
    for s in steps.values():
        if s.state in ("pending", "queued", "running"):
            if s.state in ("queued", "running"):
                running.append(s.id)
            s.state, s.finished_at = "cancelled", now()
    if running:
        try:
            sender().control.revoke(running, terminate=True, signal="SIGTERM")
        except Exception as exc:  # the Redis mark still stops them
            log.warning("revoke of %d step(s) failed: %s", len(running), exc)
    if run.status == "running":
        run.status, run.finished_at = "cancelled", now()
        run.error = {"code": "CONFLICT", "message": reason, "details": {}}


def cancel_task(rec: TaskRecord) -> None:
    """Cancel one task: a workflow step (its dependents are skipped) or a standalone operation."""
    run = None
    if rec.workflow_id:
        # Lock order as in apply_step_events (workflow row, then its steps), or the two deadlock.
        run = db.session.get(WorkflowRun, rec.workflow_id, with_for_update=True)
        db.session.refresh(rec)
    if rec.state not in ("pending", "queued", "running"):
        raise InvalidRequest(f"task {rec.id} is already {rec.state}", {"state": rec.state})
    redis_client().set(CANCEL_TASK_KEY.format(rec.id), "cancelled", ex=KEEP_S)
    if rec.state in ("queued", "running"):
        try:
            sender().control.revoke(rec.id, terminate=True, signal="SIGTERM")
        except Exception as exc:
            log.warning("revoke of %s failed: %s", rec.id, exc)
    rec.state, rec.finished_at = "cancelled", now()
    if rec.workflow_id:
        if run is not None:
            steps = {s.id: s for s in db.session.scalars(db.select(TaskRecord).where(TaskRecord.workflow_id == run.id))}
            sends = _advance(run, steps)
            db.session.commit()
            _send(sends)
            return
    elif rec.model_name:
        from ..operations import settle_model_status

        model = db.session.scalar(db.select(Model).where(Model.name == rec.model_name))
        if model is not None:
            settle_model_status(model, f"{rec.kind} cancelled")
    db.session.commit()
