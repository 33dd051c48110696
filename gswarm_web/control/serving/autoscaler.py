"""The autoscaler: a thread of the control worker that every `serving.autoscale_interval` samples the gateway's
live counts of each autoscaled service (requests in flight at its replicas and waiting in the queue, in Redis, over
every web process; the mean queue wait of the requests served since the last sample), decides with the service's
policy (`scaling_policy`), records each decision as a scaling event (when, from what to what, why, the load it saw)
and brings the service to its new count at once: placement for new replicas (DRAM before disk), draining for
removed ones. It also stops drained replicas and takes back the counts of web processes that died. One tick at a
time across control workers: a lease in Redis, and the reconciler's lock around what it changes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from typing import Any

import redis
from flask import Flask

from gswarm_tasks import names
from gswarm_tasks.celery_app import send_to_node
from gswarm_tasks.errors import InvalidRequest

from ...extensions import db, redis_client, sender, settings
from ...tables import ScalingEvent, Service, TaskRecord
from ..dispatch import forget_recorded, send_recorded
from ..nodes.fleet import current_view
from . import engine_metrics, live, reconciler
from . import policy as scaling_policy
from .policy import Sample
from .stats import stats_key

log = logging.getLogger(__name__)

KEEP_SAMPLES_S = 3600.0
HEAL_EVERY = 10  # ticks between takebacks of dead web processes' counts
RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"


def policy_of(svc: Service) -> scaling_policy.Policy | None:
    if not svc.autoscaling:
        return None
    s = settings()
    return scaling_policy.parse(svc.autoscaling, s.serve_scale_up_delay_s, s.serve_scale_down_delay_s)


class Autoscaler:
    """The samples since each service's last change, and the ticks that use them."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.samples: dict[str, deque[Sample]] = {}
        self.queue_seen: dict[
            str, tuple[float, float]
        ] = {}  # service -> (queue wait sum, count) at the last tick
        self.ticks = 0

    def _lease(self, client: redis.Redis, interval_s: float) -> bool:
        ttl = int(max(2.0, 4 * interval_s) * 1000)
        if client.set(names.AUTOSCALER_LOCK_KEY, self.id, nx=True, px=ttl):
            return True
        return bool(client.eval(RENEW, 1, names.AUTOSCALER_LOCK_KEY, self.id, ttl))

    def tick(self) -> int:
        """One sample of every autoscaled service, its decisions applied; the operations recorded (and sent)."""
        client = redis_client()
        s = settings()
        if not self._lease(client, s.serve_autoscale_interval_s):
            self.samples.clear()  # another control worker scales; its history is its own
            return 0
        self.ticks += 1
        services = list(
            db.session.scalars(db.select(Service).where(Service.status.not_in(("stopping", "stopped"))))
        )
        now = time.monotonic()
        sampled = {svc.id: self._sample(client, svc, now) for svc in services if svc.autoscaling}
        if not client.set(names.RECONCILER_LOCK_KEY, "1", nx=True, px=30_000):
            db.session.rollback()
            return 0  # the reconciler's round is under way: decide at the next tick
        try:
            tasks: list[TaskRecord] = []
            for svc in services:
                tasks += reconciler.finish_drains(svc)
                if svc.id in sampled:
                    tasks += self._scale(svc, sampled[svc.id], now)
            db.session.commit()
        except BaseException:
            db.session.rollback()
            forget_recorded()
            raise
        finally:
            client.delete(names.RECONCILER_LOCK_KEY)
        send_recorded()
        if self.ticks % HEAL_EVERY == 0:
            live.heal(client)
        return len(tasks)

    def _sample(self, client: redis.Redis, svc: Service, now: float) -> Sample:
        running = [r.id for r in svc.members if r.status == "running"]
        in_flight, waiting = live.counts(client, running, [svc.id])
        wait = engine = None
        if (svc.autoscaling or {}).get("target_queue_wait_s") is not None:
            wait = self._queue_wait(client, svc)
        if (svc.autoscaling or {}).get("target_engine_waiting") is not None:
            # a scrape is as old as the node's health checks are apart: two of them may pass before it is stale
            engine = engine_metrics.engine_waiting(client, running, 3 * settings().serve_check_interval_s)
        sample = Sample(now, sum(in_flight.values()), waiting.get(svc.id, 0), wait, engine)
        history = self.samples.setdefault(svc.id, deque())
        history.append(sample)
        while history and history[0].at < now - KEEP_SAMPLES_S:
            history.popleft()
        return sample

    def _queue_wait(self, client: redis.Redis, svc: Service) -> float | None:
        """The mean queue wait of the service's requests answered since the last tick (None: none was)."""
        pipe = client.pipeline(transaction=False)
        for r in svc.members:
            pipe.hmget(stats_key(r.id), ["queue|sum", "queue|n"])
        total, count = 0.0, 0.0
        for got in pipe.execute():
            total += float(got[0] or 0.0)
            count += float(got[1] or 0.0)
        before = self.queue_seen.get(svc.id)
        self.queue_seen[svc.id] = (total, count)
        if before is None or count <= before[1]:
            return None
        return (total - before[0]) / (count - before[1])

    def _scale(self, svc: Service, sample: Sample, now: float) -> list[TaskRecord]:
        policy = policy_of(svc)
        if policy is None:
            return []
        history = self.samples.get(svc.id) or deque([sample])
        decision = scaling_policy.decide(policy, svc.replicas, list(history), now)
        if decision is None:
            return []
        want, reason = decision
        if want == svc.replicas:
            return []
        load: dict[str, Any] = {"in_flight": sample.in_flight, "waiting": sample.waiting}
        if sample.queue_wait_s is not None:
            load["queue_wait_s"] = round(sample.queue_wait_s, 4)
        if sample.engine_waiting is not None:
            load["engine_waiting"] = sample.engine_waiting
        return apply(svc, want, reason, load, self.samples)


def apply(
    svc: Service,
    want: int,
    reason: str,
    load: dict[str, Any],
    samples: dict[str, deque[Sample]] | None = None,
) -> list[TaskRecord]:
    """Record a decision and bring the service to `want` replicas now (operations recorded; the caller commits)."""
    direction = "up" if want > svc.replicas else "down"
    db.session.add(ScalingEvent(service_id=svc.id, from_replicas=svc.replicas, to_replicas=want, direction=direction,
                                reason=reason[:500], load=load))  # fmt: skip
    log.info("service %s (%s): %d -> %d replicas: %s", svc.id, svc.model.name, svc.replicas, want, reason)
    svc.replicas = want
    if samples is not None:
        samples.pop(svc.id, None)  # the next decision waits out its delay at the new count
    if svc.status == "idle" and want > 0:
        svc.status, svc.status_message = "starting", f"starting: {reason}"
    return reconciler.fill(svc)


class AutoscalerLoop:
    """The autoscaler's thread in the control worker's main process (a consumer of ControlConsumers)."""

    def __init__(self, app: Flask, consumer: str) -> None:
        self.app, self.consumer = app, consumer
        self.scaler = Autoscaler()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gswarm-autoscaler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.app.app_context():
                interval = settings().serve_autoscale_interval_s
                try:
                    self.scaler.tick()
                except Exception as exc:  # a lost connection must not stop the next tick
                    log.warning("autoscaler tick failed: %s", exc)
                finally:
                    db.session.remove()
            self._stop.wait(max(0.05, interval))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# ---- what the API asks of it ------------------------------------------------------------------------------------


def initial_replicas(doc: Any, replicas: int | None, most: int | None = None) -> int:
    """The count an autoscaled service starts with (`replicas`, else its min_replicas), its policy checked."""
    s = settings()
    policy = scaling_policy.parse(doc, s.serve_scale_up_delay_s, s.serve_scale_down_delay_s)
    if most is not None and policy.max_replicas > most:
        raise InvalidRequest(
            f"autoscaling.max_replicas: {policy.max_replicas} for {most} nodes; a service on `nodes` has at most one "
            "replica on each",
            {"field": "autoscaling.max_replicas"},
        )
    if replicas is None:
        return policy.min_replicas
    if not policy.min_replicas <= replicas <= policy.max_replicas:
        raise InvalidRequest(
            f"replicas: {replicas} is outside min_replicas {policy.min_replicas} and max_replicas "
            f"{policy.max_replicas}",
            {"field": "replicas"},
        )
    return replicas


def update(svc: Service, args: dict[str, Any]) -> None:
    """PATCH /services/{id}: its autoscaling policy (null: off) and its replica count, checked; a changed count is
    recorded as a scaling event and applied now (an idle service keeps sleeping until a request comes)."""
    auto = svc.device.startswith("auto")
    if "autoscaling" in args:
        if args["autoscaling"] is not None:
            if not auto:
                raise InvalidRequest("autoscaling: a service pinned to one device has one replica",
                                     {"field": "autoscaling"})  # fmt: skip
            nodes = (svc.config or {}).get("nodes")
            initial_replicas(args["autoscaling"], None, len(nodes) if nodes else None)
        svc.autoscaling = args["autoscaling"]
    want = args.get("replicas")
    if want is None or want == svc.replicas:
        return
    if not auto:
        raise InvalidRequest(
            "replicas: a service pinned to one device has one replica", {"field": "replicas"}
        )
    policy = policy_of(svc)
    low, high = (policy.min_replicas, policy.max_replicas) if policy else (1, scaling_policy.MOST_REPLICAS)
    if not low <= want <= high:
        raise InvalidRequest(f"replicas: from {low} to {high}" + (" (its autoscaling's bounds)" if policy else ""),
                             {"field": "replicas"})  # fmt: skip
    if svc.status == "idle":
        svc.replicas = want
        return
    apply(svc, want, "asked for (PATCH /services)", {})


def prewarm(svc: Service) -> None:
    """An autoscaled service of the built-in server (or `auto`): its nodes start their warm starters now, so the
    first scale-up onto a node does not wait for the server's libraries to load."""
    if not svc.autoscaling or svc.backend not in ("builtin", "auto"):
        return
    nodes = (svc.config or {}).get("nodes") or [
        n["name"] for n in current_view()["nodes"] if n["status"] == "healthy"
    ]
    for node in nodes:
        try:
            send_to_node(sender(), node, names.SERVICE_PREWARM, priority="high", expires=60)
        except Exception as exc:  # a start without it only takes longer
            log.warning("prewarm of %s not sent: %s", node, exc)


def report(svc: Service, limit: int = 50) -> dict[str, Any]:
    """GET /services/{id}/scaling: the policy, the live load the autoscaler sees and its latest decisions."""
    running = [r.id for r in svc.members if r.status in ("running", "draining")]
    try:
        in_flight, waiting = live.counts(redis_client(), running, [svc.id])
        engine = engine_metrics.engine_waiting(redis_client(), running, 3 * settings().serve_check_interval_s)
    except redis.RedisError:
        in_flight, waiting, engine = {}, {}, None
    events = db.session.scalars(
        db.select(ScalingEvent)
        .where(ScalingEvent.service_id == svc.id)
        .order_by(ScalingEvent.id.desc())
        .limit(limit)
    ).all()
    policy = policy_of(svc)
    return {
        "service_id": svc.id,
        "autoscaling": policy.doc() if policy else None,
        "replicas": svc.replicas,
        "ready_replicas": sum(r.status == "running" for r in svc.members),
        "draining_replicas": sum(r.status == "draining" for r in svc.members),
        "in_flight": in_flight,
        "waiting": waiting.get(svc.id, 0),
        "engine_waiting": engine,
        "events": [
            {
                "at": e.at.isoformat(),
                "from_replicas": e.from_replicas,
                "to_replicas": e.to_replicas,
                "direction": e.direction,
                "reason": e.reason,
                "load": e.load,
            }  # fmt: skip
            for e in events
        ],
    }
