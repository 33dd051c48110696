"""Keeps every `auto` service at its replica count: places and starts replicas (after a verified copy of the
weights when the chosen node has none), replaces those whose node stopped answering or whose server died, scales
down by draining (a replica takes no new request and stops once its requests are answered; its weights stay staged
in the node's DRAM within `serving.dram_budget`, for the next scale-up), unloads a service nobody called for
`idle_timeout_s` (weights staged the same way) and brings it back when a request comes. The control worker runs it
every few seconds, whenever the gateway asks, and the autoscaler's ticks (`control/autoscaler.py`) in between."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.devices import Auto, Device, parse_target
from gswarm_tasks.errors import GswarmError, ResourceUnavailable
from gswarm_tasks.serving.engines import TP_PARAM
from gswarm_tasks.storage import prefix as storage_prefix

from ...extensions import db, redis_client, settings
from ...tables import ModelLocation, Node, Replica, Service, TaskRecord
from ...tables import utcnow as now
from ..dispatch import peer_source, record
from ..nodes.placement import choose, current_load, tensor_parallel
from ..nodes.state import node_status
from . import live
from . import state as service_state
from .config import engine_config

log = logging.getLogger(__name__)

RETRY_NODE_AFTER_S = 60.0  # a node where a replica just failed is avoided this long
DRAIN_MIN_S = 1.0  # a web process that routes without Redis re-reads the replicas within a second


def _node_status(names_: set[str]) -> dict[str, str]:
    s = settings()
    rows: list[Node] = (
        list(db.session.scalars(db.select(Node).where(Node.name.in_(list(names_))))) if names_ else []
    )
    return {n.name: node_status(n, now(), s.heartbeat_timeout_s, s.offline_after_s) for n in rows}


def _copy_for(svc: Service, rep: Replica) -> TaskRecord | None:
    """A verified copy of the weights onto the replica's node's disk, from the best peer; None if no peer has one."""
    model = svc.model
    sources = [loc for loc in model.locations if loc.status == "ready" and loc.tier in ("dram", "disk")]
    statuses = _node_status({loc.node for loc in sources})
    sources = [loc for loc in sources if statuses.get(loc.node) == "healthy" and loc.node != rep.node]
    if not sources or not model.manifest:
        return None
    src = sorted(sources, key=lambda loc: (loc.tier != "dram", loc.node))[0]
    peer = db.session.get(Node, src.node)
    if peer is None:
        return None
    kwargs = {
        "model": model.name,
        "manifest": model.manifest,
        "target_tier": "disk",
        "source": peer_source(peer, src.tier, storage_prefix(src.tier, "models", model.name)),
        "bandwidth_limit": None,
    }
    target = f"{rep.node}:disk"
    return record(
        "copy",
        rep.node,
        names.MODEL_COPY,
        kwargs,
        "high",
        model_name=model.name,
        source=src.device,
        target=target,
    )


def place_replica(svc: Service, exclude: set[str] | None = None) -> tuple[Replica, TaskRecord]:
    """Choose a device for one more replica (spread over nodes), and record what starts it: its server, or first
    a copy of the weights. Raises ResourceUnavailable when nothing fits."""
    target = parse_target(svc.device, "device")
    tp = int(engine_config(svc.config).get(TP_PARAM) or 1)
    if isinstance(target, Auto):
        spread = {r.node for r in service_state.live_replicas(svc)}
        load = current_load(svc.model, spread)
        load.exclude = set(exclude or ())
        decision = choose(svc.model, "serve", target, load, among=(svc.config or {}).get("nodes"), share=tp,
                          engine=svc.backend)  # fmt: skip
        if tp > 1 and Device.parse(decision["chosen"]).is_gpu:
            decision = tensor_parallel(decision, svc.model, tp, load)
    else:  # a pinned service woken after an idle unload: its own device
        tier = service_state.serving_tier(svc.model, str(target.node))
        decision = {
            "action": "serve",
            "model": svc.model.name,
            "chosen": str(target),
            "loaded_from": tier or "peer",
        }
        decision["candidates"] = [
            {"device": str(target), "chosen": True, "loaded_from": decision["loaded_from"]}
        ]
    rep = service_state.add_replica(svc, Device.parse(decision["chosen"]), decision)
    tier = service_state.serving_tier(svc.model, rep.node)
    if tier is not None:
        return rep, service_state.start_replica(svc, rep, tier)
    copy = _copy_for(svc, rep)
    if copy is None:
        rep.status, rep.status_message = "failed", "no copy of the weights on a healthy node to copy from"
        raise ResourceUnavailable(
            f"{svc.model.name}: {rep.status_message}", {"service_id": svc.id, "node": rep.node}
        )
    rep.status, rep.task_id = "placing", copy.id
    return rep, copy


def copy_landed(rec: TaskRecord) -> None:
    """A model copy finished: replicas that waited for it start (or fail with it)."""
    waiting = db.session.scalars(
        db.select(Replica).where(Replica.task_id == rec.id, Replica.status == "placing")
    )
    for rep in waiting:
        svc = rep.service
        if rec.state == "succeeded" and service_state.serving_tier(svc.model, rep.node):
            service_state.start_replica(svc, rep, str(service_state.serving_tier(svc.model, rep.node)))
        else:
            rep.status, rep.stopped_at = "failed", now()
            rep.status_message = (
                f"copying the weights to {rep.node} failed: {(rec.error or {}).get('message')}"
            )
        service_state.refresh(svc)


def _recently_failed(svc: Service) -> set[str]:
    cutoff = now() - timedelta(seconds=RETRY_NODE_AFTER_S)
    return {
        r.node for r in svc.members if r.status in ("failed", "lost") and (r.stopped_at or now()) > cutoff
    }


def _lose_unreachable(svc: Service) -> None:
    """A replica on a node that stopped answering is given up at once (the gateway stops routing to it)."""
    live_ = [*service_state.live_replicas(svc), *service_state.draining(svc)]
    statuses = _node_status({r.node for r in live_})
    for r in live_:
        if statuses.get(r.node, "offline") != "healthy" and r.status != "pending":
            r.status, r.healthy, r.stopped_at = "lost", False, now()
            r.status_message = f"{r.node} is {statuses.get(r.node, 'gone')}"


def fill(svc: Service) -> list[TaskRecord]:
    """Bring an auto service to its replica count (recorded; sent after the caller commits): the newest and
    not-yet-serving replicas go first, a serving one is drained."""
    tasks: list[TaskRecord] = []
    live_ = service_state.current(svc)  # an earlier generation's replicas serve on until this one is up
    for rep in sorted(live_, key=lambda r: (r.status == "running", r.created_at), reverse=True)[
        svc.replicas :
    ]:
        tasks += _take_out(svc, rep, "scaled down", "scaled down before it started")
    exclude = _recently_failed(svc)
    for _ in range(svc.replicas - len(live_)):
        try:
            tasks.append(place_replica(svc, exclude)[1])
        except GswarmError as exc:
            svc.status_message = exc.message
            log.warning("service %s (%s): %s", svc.id, svc.model.name, exc.message)
            break
    tasks += _retire(svc)
    service_state.refresh(svc)
    return tasks


def _retire(svc: Service) -> list[TaskRecord]:
    """A rolling update's last step: once the current generation has its replica count running, the earlier
    generation's replicas drain (no new request; each stops when its requests are answered)."""
    old = service_state.superseded(svc)
    up = sum(r.status == "running" for r in service_state.current(svc))
    if not old or up < max(1, svc.replicas):
        return []
    tasks: list[TaskRecord] = []
    for rep in old:
        tasks += _take_out(svc, rep, "replaced by a rolling update")
    svc.status_message = None
    return tasks


def _take_out(svc: Service, rep: Replica, why: str, before_start: str | None = None) -> list[TaskRecord]:
    """A replica leaves its service: a serving one drains, one not started yet is marked stopped (`before_start`
    says why, else `why`), any other is stopped."""
    if rep.status in ("running", "unhealthy"):
        return start_drain(svc, rep)
    if rep.status in ("pending", "placing"):
        rep.status, rep.stopped_at, rep.status_message = "stopped", now(), before_start or why
        return []
    return [service_state.stop_replica(rep, why)]


def start_drain(svc: Service, rep: Replica) -> list[TaskRecord]:
    """A replica takes no new request from now on (every web process's next pick skips it) and is stopped once its
    requests are answered (`finish_drains`); its weights are staged in its node's DRAM for the next scale-up."""
    rep.status, rep.draining_since = "draining", now()
    rep.status_message = "scaled down: draining (no new request; stops when its requests are answered)"
    live.drain(redis_client(), [rep.id])
    return stage_in_dram(svc, rep.node)


def finish_drains(svc: Service) -> list[TaskRecord]:
    """Stop the draining replicas with no request in flight in any web process (or past `serving.drain_timeout`)."""
    draining = service_state.draining(svc)
    if not draining:
        return []
    in_flight, _ = live.counts(redis_client(), [r.id for r in draining], [])
    tasks = []
    s = settings()
    for rep in draining:
        age = (now() - (rep.draining_since or now())).total_seconds()
        idle = in_flight.get(rep.id, 0) == 0
        if (idle and age >= DRAIN_MIN_S) or age >= s.serve_drain_timeout_s:
            why = "scaled down: drained" if idle else f"scaled down: stopped after {age:.0f} s draining"
            tasks.append(service_state.stop_replica(rep, why))
    return tasks


def _dram_budget(node: Node | None) -> float:
    budget = settings().serve_dram_budget
    if node is None:
        return 0.0
    return budget * float(node.dram_total_bytes or 0) if budget <= 1 else budget


def stage_in_dram(svc: Service, node_name: str) -> list[TaskRecord]:
    """Copy the model's weights into the node's DRAM (keeping the disk copy) when it has none there and they fit
    the node's DRAM budget with the weights already staged there: a replica started there later loads from DRAM."""
    model = svc.model
    if db.session.get(ModelLocation, (model.id, f"{node_name}:dram")) is not None or not model.manifest:
        return []
    disk = db.session.get(ModelLocation, (model.id, f"{node_name}:disk"))
    node = db.session.get(Node, node_name)
    if disk is None or disk.status != "ready" or node is None:
        return []
    size = float(model.model_size or model.manifest.get("total_bytes") or 0)
    staged = db.session.scalars(
        db.select(ModelLocation).where(ModelLocation.node == node_name, ModelLocation.tier == "dram")
    ).all()
    held = sum(
        float(loc.model.model_size or (loc.model.manifest or {}).get("total_bytes") or 0) for loc in staged
    )
    if held + size > _dram_budget(node) or size > float(node.dram_available_bytes or 0):
        log.info("%s stays on %s's disk: DRAM budget %.0f bytes, %.0f staged", model.name, node_name,
                 _dram_budget(node), held)  # fmt: skip
        return []
    kwargs = {"model": model.name, "manifest": model.manifest, "source_tier": "disk", "target_tier": "dram",
              "keep_source": True}  # fmt: skip
    return [record("move", node_name, names.MODEL_MOVE, kwargs, model_name=model.name, source=disk.device,
                   target=f"{node_name}:dram")]  # fmt: skip


def _last_requests() -> dict[str, float]:
    raw: Any = redis_client().hgetall(names.SERVICE_LAST_REQUEST_KEY)
    return {k.decode(): float(v) for k, v in raw.items()}


def _unload(svc: Service) -> list[TaskRecord]:
    """Stop every replica of an idle service; its weights stay (or are staged) in the nodes' DRAM."""
    tasks = []
    for rep in service_state.live_replicas(svc):
        tasks += stage_in_dram(svc, rep.node)
        tasks.append(service_state.stop_replica(rep, f"idle for {svc.idle_timeout_s:g} s"))
    svc.status, svc.status_message = (
        "idle",
        f"no request for {svc.idle_timeout_s:g} s; the next one starts it",
    )
    return tasks


def reconcile() -> int | None:
    """One round over every auto service; returns the operations it recorded (the caller commits and sends), or
    None when another round is under way (two would place the same replica twice)."""
    client = redis_client()
    if not client.set(names.RECONCILER_LOCK_KEY, "1", nx=True, px=30_000):
        return None
    try:
        return _round()
    finally:
        client.delete(names.RECONCILER_LOCK_KEY)


def _round() -> int:
    tasks: list[TaskRecord] = []
    last = _last_requests()
    for svc in db.session.scalars(db.select(Service).where(Service.status.not_in(("stopping", "stopped")))):
        auto = service_state.is_auto(svc)
        tasks += finish_drains(svc)
        if not auto and not svc.idle_timeout_s:
            continue  # a pinned service is the node's to keep; only its idle unload is the reconciler's
        if auto:
            _lose_unreachable(svc)
        if svc.status == "idle":
            continue
        serving = [r.started_at.timestamp() for r in svc.members if r.status == "running" and r.started_at]
        # idle counts from the last request, or from when it came up: a service still starting is never idle
        idle_for = now().timestamp() - max(last.get(svc.id, 0.0), *serving) if serving else 0.0
        if svc.idle_timeout_s and idle_for > svc.idle_timeout_s:
            tasks += _unload(svc)
            continue
        if auto or (
            svc.status == "starting" and not service_state.live_replicas(svc)
        ):  # or woken by a request
            tasks += fill(svc)
    return len(tasks)
