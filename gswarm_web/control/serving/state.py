"""Services' state: a service is a group of replicas (model server processes) with one status.

A replica's row follows its operations (a copy of the weights when placement chose a node without them, its
start, its stop) and the health its node reports; the service's status is computed from its replicas. A service
asked for with `auto` is kept at its replica count by the reconciler (`control/reconciler.py`); a pinned one (a
device was named) is reported as it is, dead or alive.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

from gswarm_tasks import names
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import NotFound
from gswarm_tasks.serving.engines import TP_PARAM

from ...extensions import db, redis_client
from ...tables import Model, Replica, Service, TaskRecord
from ...tables import utcnow as now
from ..dispatch import record
from ..report import Report
from . import live
from .config import engine_config

SERVICE_STATES = (
    "pending",
    "starting",
    "running",
    "degraded",
    "unhealthy",
    "idle",
    "stopping",
    "stopped",
    "failed",
)
REPLICA_STATES = ("pending", "placing", "starting", "running", "unhealthy", "draining", "stopping", "stopped", "failed",
                  "lost")  # fmt: skip
LIVE = ("pending", "placing", "starting", "running", "unhealthy")  # a replica that serves, or will
# `draining`: scaled down, it takes no new request and stops once its requests are answered (not counted as live)
ENDED = ("stopping", "stopped", "failed", "lost")


def is_auto(svc: Service) -> bool:
    return svc.device.startswith("auto")


def get_service(service_id: str) -> Service:
    svc = db.session.get(Service, service_id)
    if svc is None:
        raise NotFound(f"no service {service_id!r}", {"service_id": service_id})
    return svc


def live_replicas(svc: Service) -> list[Replica]:
    return [r for r in svc.members if r.status in LIVE]


def draining(svc: Service) -> list[Replica]:
    return [r for r in svc.members if r.status == "draining"]


def serving_tier(model: Model, node: str) -> str | None:
    """The tier a server on `node` loads the model from: dram before disk; None when neither holds it."""
    tiers = {loc.tier for loc in model.locations if loc.node == node and loc.status == "ready"}
    return next((t for t in ("dram", "disk") if t in tiers), None)


def port_taken(node: str, port: int) -> bool:
    return bool(
        db.session.scalar(
            db.select(Replica.id).where(Replica.node == node, Replica.port == port, Replica.status.in_(LIVE))
        )
    )


def create(
    model: Model, device: str, replicas: int, port: int | None, backend: str, **options: Any
) -> Service:
    """Record a service (no replica yet)."""
    svc = Service(
        id=str(uuid.uuid4()),
        model_id=model.id,
        model=model,
        device=device,
        replicas=replicas,
        port=port,
        backend=backend,
        config=options.get("config") or {},
        status=options.get("status", "starting"),
        idle_timeout_s=options.get("idle_timeout_s"),
        cold_start_timeout_s=options.get("cold_start_timeout_s") or 120.0,
        members=[],
    )
    db.session.add(svc)
    return svc


def add_replica(
    svc: Service, dev: Device, placement: dict[str, Any] | None = None, status: str = "starting"
) -> Replica:
    rep = Replica(
        id=str(uuid.uuid4()),
        service_id=svc.id,
        node=str(dev.node),
        device=str(dev),
        port=svc.port,
        status=status,
        placement=placement,
        created_at=now(),
        generation=svc.generation or 0,
    )
    svc.members.append(rep)
    return rep


def current(svc: Service) -> list[Replica]:
    """The live replicas of the service's current generation (what its replica count counts)."""
    return [r for r in svc.members if r.status in LIVE and (r.generation or 0) == (svc.generation or 0)]


def superseded(svc: Service) -> list[Replica]:
    """Live replicas of an earlier generation: they serve until the current one is up, then drain."""
    return [r for r in svc.members if r.status in LIVE and (r.generation or 0) != (svc.generation or 0)]


def update_serving(svc: Service, engine: str, config: dict[str, Any]) -> bool:
    """PATCH /services/{id}'s `engine` and `config`: the service's own keys (aliases, timeout, load_balancing,
    max_in_flight) apply at once; another preset or other parameters start a new generation, which the reconciler
    brings up beside the serving one before it drains the old (a rolling update). True for a new generation."""
    old_engine, old_params = svc.backend, engine_config(svc.config)
    kept = {k: v for k, v in (svc.config or {}).items() if k == "nodes"}
    svc.config = {**config, **kept}
    svc.backend = engine
    if engine == old_engine and engine_config(svc.config) == old_params:
        return False
    svc.generation = (svc.generation or 0) + 1
    svc.status_message = f"rolling update to generation {svc.generation} ({engine}): its replicas start first"
    return True


def start_replica(svc: Service, rep: Replica, tier: str) -> TaskRecord:
    """Record the start of a replica's server from the model's copy on `tier` of its node (sent after commit)."""
    kwargs = {
        "service_id": rep.id,
        "model": svc.model.name,
        "tier": tier,
        "device": rep.device,
        "port": svc.port,
        "backend": svc.backend,
        "config": engine_config(svc.config),  # the preset's parameters, not the service's own keys
        "trust_remote_code": svc.model.trust_remote_code,
        "gpus": _gpus(svc, rep),
    }
    rec = record("serve", rep.node, names.SERVICE_START, kwargs, "high", service_id=rep.id, target=rep.device)
    rep.status, rep.task_id = "starting", rec.id
    return rec


def _gpus(svc: Service, rep: Replica) -> list[int] | None:
    """The GPUs of a tensor-parallel replica: placement's, or for a named device that GPU and the ones after it."""
    dev = Device.parse(rep.device)
    tp = int(engine_config(svc.config).get(TP_PARAM) or 1)
    if not dev.is_gpu or tp <= 1:
        return None
    return (rep.placement or {}).get("gpus") or [int(dev.gpu_index or 0) + i for i in range(tp)]


def stop_replica(rep: Replica, reason: str | None = None) -> TaskRecord:
    rep.status = "stopping"
    if reason:
        rep.status_message = reason
    return record(
        "stop_serve",
        rep.node,
        names.SERVICE_STOP,
        {"service_id": rep.id},
        "high",
        service_id=rep.id,
        source=rep.device,
    )


def stop(svc: Service) -> list[TaskRecord]:
    """Stop every replica of a service (recorded; sent after the caller commits)."""
    svc.status = "stopping"
    tasks = [
        stop_replica(r)
        for r in svc.members
        if r.status in (*LIVE, "draining") and r.status not in ("pending", "placing")
    ]
    for r in svc.members:
        if r.status in ("pending", "placing"):
            r.status, r.stopped_at = "stopped", now()
    refresh(svc)
    return tasks


def refresh(svc: Service) -> None:
    """The service's one status, from its replicas and the count it is kept at."""
    if svc.status in ("stopping", "stopped"):
        if all(r.status in ("stopped", "failed", "lost") for r in svc.members):
            svc.status, svc.stopped_at = "stopped", svc.stopped_at or now()
        return
    live = live_replicas(svc)
    running = [r for r in svc.members if r.status == "running"]
    if svc.replicas == 0 and not live:
        svc.status, svc.status_message = "idle", "scaled to zero; the next request starts it"
        return
    if svc.status == "idle" and not live:
        return
    if running:
        svc.status = "running" if len(running) >= svc.replicas else "degraded"
        svc.status_message = (
            None if len(running) >= svc.replicas else f"{len(running)} of {svc.replicas} running"
        )
    elif any(r.status == "unhealthy" for r in live):
        svc.status = "unhealthy"
        svc.status_message = next(r.status_message for r in live if r.status == "unhealthy")
    elif live:
        svc.status = (
            "pending" if svc.status == "pending" and all(r.status == "pending" for r in live) else "starting"
        )
    else:
        svc.status = "failed"
        ended = [r for r in svc.members if r.status in ("failed", "lost")]
        svc.status_message = ended[-1].status_message if ended else svc.status_message


def _replica_of(rec: TaskRecord, data: dict[str, Any] | None = None) -> Replica | None:
    rid = rec.service_id or (data or {}).get("service_id")
    return db.session.get(Replica, rid) if rid else None


def on_succeeded(rec: TaskRecord, data: dict[str, Any]) -> None:
    rep = _replica_of(rec, data)
    if rep is None:
        return
    if rec.kind == "serve" and rep.status in ("pending", "starting"):
        rep.status, rep.pid, rep.port, rep.url = "running", data.get("pid"), data.get("port"), data.get("url")
        rep.started_at, rep.healthy, rep.last_check_at = now(), True, now()
        rep.engine = str(data.get("engine") or rep.service.backend)
    elif rec.kind == "serve" and rep.status in (
        "stopping",
        "stopped",
    ):  # scaled down while it started: no orphan
        stop_replica(rep, rep.status_message)
    elif rec.kind == "stop_serve":
        rep.status, rep.stopped_at = "stopped", now()
        _forget([rep.id])
        svc = rep.service
        # Every replica stopped on purpose: the service is stopped, not failed; unless it sleeps (idle unload, or
        # scaled to zero), when the next request starts it again.
        if (
            svc.status != "idle"
            and svc.replicas > 0
            and svc.members
            and all(r.status in ENDED for r in svc.members)
        ):
            svc.status = "stopping"
    refresh(rep.service)


def on_failed(rec: TaskRecord) -> None:
    rep = _replica_of(rec)
    if rep is None:
        return
    message = (rec.error or {}).get("message")
    if rec.kind == "serve":
        rep.status, rep.status_message, rep.stopped_at = "failed", message, now()
    elif rec.kind == "stop_serve" and (rec.error or {}).get("code") == "NOT_FOUND":
        rep.status, rep.stopped_at = (
            "stopped",
            rep.stopped_at or now(),
        )  # its node runs no such server (any more)
        _forget([rep.id])
    elif rec.kind == "stop_serve":
        rep.status_message = f"stop failed: {message}"
    refresh(rep.service)


def serve_step_ended(rec: TaskRecord, sent: bool) -> None:
    """A workflow's serve step ended without starting its server (skipped behind a step that did not succeed, or
    cancelled): its replica ends, and its service with it when no other replica lives, so nothing routes to a server
    that will never run and the service's port is free. A step that was sent may be starting the server on its node:
    it is stopped there (a node that never started it answers NOT_FOUND: stopped)."""
    rep = _replica_of(rec)
    if rep is None or rep.status not in LIVE:
        return
    why = (
        "not started: its workflow step was skipped (a step it depends on did not succeed)"
        if rec.state == "skipped"
        else f"not started: its workflow step was {rec.state}"
    )
    if sent:
        stop_replica(rep, why)
    else:
        rep.status, rep.status_message, rep.stopped_at = "stopped", why, now()
    svc = rep.service
    if not live_replicas(svc):
        svc.status, svc.status_message = "stopping", why
    refresh(svc)


def service_healthy(svc: Service) -> bool | None:
    """Whether the service answers: True when every running replica passed its last check, False when one failed
    it, None when none runs (not started yet, idle, stopped)."""
    running = [r for r in svc.members if r.status in ("running", "unhealthy")]
    return all(bool(r.healthy) for r in running) if running else None


def _forget(replica_ids: list[str]) -> None:
    try:
        live.forget(redis_client(), replica_ids)
    except redis.RedisError:  # the next stop of the same replica cannot come; its zero count is harmless
        pass


def _health(rep: Replica, report: dict[str, Any] | None) -> bool:
    """One replica's latest check; True when a live replica should be stopped (it was already given up)."""
    if report is not None and report.get("starting"):
        return False  # a check from before the server was ready says nothing about it
    if rep.status == "draining":  # its own stop comes when it is drained; only its death is news
        if report is None or not report.get("alive"):
            rep.status, rep.healthy, rep.stopped_at = "failed", False, now()
            rep.status_message = "the server process is gone (while draining)"
        return False
    if rep.status in ("failed", "lost"):
        return bool(report and report.get("alive"))
    rep.last_check_at = now()
    if report is None:
        rep.status, rep.healthy, rep.stopped_at = "failed", False, now()
        rep.status_message = f"{rep.node} no longer runs this service"
        return False
    rep.healthy = bool(report.get("healthy"))
    if not report.get("alive"):
        rep.status, rep.status_message, rep.stopped_at = "failed", "the server process is gone", now()
    else:
        rep.status = "running" if report.get("healthy") else "unhealthy"
        rep.status_message = None if report.get("healthy") else str(report.get("message"))[:500]
    return False


def apply_health(reports_by_node: dict[str, list[dict[str, Any]]]) -> None:
    """The health of replicas as their nodes checked them (one query for the batch). A dead process marks its
    replica `failed`; so does a running replica its node no longer knows; one given up that still runs is stopped."""
    if not reports_by_node:
        return
    rows = list(
        db.session.scalars(
            db.select(Replica).where(
                Replica.node.in_(list(reports_by_node)),
                Replica.status.in_(("running", "unhealthy", "draining", "failed", "lost")),
            )
        )
    )
    touched = set()
    for rep in rows:
        seen = {r.get("service_id"): r for r in reports_by_node[rep.node] if isinstance(r, dict)}
        if rep.status in ("failed", "lost") and rep.id not in seen:
            continue
        if _health(rep, seen.get(rep.id)):
            stop_replica(rep, rep.status_message)
        touched.add(rep.service_id)
    for sid in touched:
        svc = db.session.get(Service, sid)
        if svc is not None:
            refresh(svc)


def apply_reports(reports: list[Report]) -> None:
    """The intake's route for service health: each node's newest round of checks in the batch."""
    latest: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        services = r.data.get("services")
        if isinstance(services, list):
            latest[r.id] = services
    apply_health(latest)
