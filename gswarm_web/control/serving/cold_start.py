"""The gateway's queue: requests waiting for a replica of their model in this web process, while one starts (from
idle or zero, after a failover, a scale-up) or while every replica has its `max_in_flight`.

At most `serving.cold_start_waiters` wait at once, per web process: what a waiter holds (a greenlet, or a thread
of a fixed pool, and a socket) is the process's, and a count kept in the process cannot leak when a process dies.
Under a server that gives each request an OS thread of a fixed pool (gunicorn's gthread or sync worker), a waiting
request holds one of those threads whatever the code does, so the bound is also kept below the pool's size: one
thread always stays free for `/api/v1/health` and every other request. Waiters share one watcher that re-reads the
replicas and wakes them together; a waiting request holds no database connection and no lock. How many wait per
service is counted in the shared live counts too: the autoscaler scales on it.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

import redis
from flask import Flask, current_app

from gswarm_tasks import names

from ...extensions import db, redis_client, sender, settings
from ...tables import Model, ScalingEvent, Service
from . import live
from .table import Target, directory

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.05  # a waiter tries again this often (a slot may free up in another process)
REFRESH_EVERY = 4  # rounds between re-reads of the tables (0.2 s)


def _cooperative() -> bool:
    """True when threads are green (gevent's or eventlet's monkey patching): a waiter then costs no OS thread."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return True
    patcher = sys.modules.get("eventlet.patcher")
    return bool(patcher is not None and patcher.is_monkey_patched("thread"))


def request_threads() -> int | None:
    """The requests this process answers at once when each holds an OS thread of a fixed pool (gunicorn's gthread:
    its --threads; sync: one), else None (green threads, or a server that starts a thread per request)."""
    if _cooperative():
        return None
    # gunicorn hands the app no view of its worker; the worker's own SIGQUIT handler is a method of it.
    worker: Any = getattr(signal.getsignal(signal.SIGQUIT), "__self__", None)
    kind = type(worker).__module__
    if kind == "gunicorn.workers.gthread":
        return max(1, int(getattr(worker.cfg, "threads", 1)))
    return 1 if kind == "gunicorn.workers.sync" else None


def limit() -> int:
    """How many requests of this process may wait on cold starts at once."""
    bound = max(0, settings().serve_cold_start_waiters)
    threads = request_threads()
    return bound if threads is None else min(bound, threads - 1)


class Waiters:
    """The cold-start waiters of this process and their one watcher."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0
        self.rounds = 0  # watcher rounds: a waiter sleeps until the next one
        self.watching = False

    def enter(self, bound: int, app: Flask) -> bool:
        """Take a place (False when `bound` requests already wait); starts the watcher if none runs."""
        with self.cond:
            if self.count >= bound:
                return False
            self.count += 1
            if not self.watching:
                self.watching = True
                threading.Thread(
                    target=self._watch, args=(app,), name="gswarm-cold-start", daemon=True
                ).start()
            return True

    def leave(self) -> None:
        with self.cond:
            self.count -= 1

    def wait_for(self, model: str, deadline: float, tried: set[str], path: str | None) -> Target | None:
        """A replica of `model` once one can take the request, or None at `deadline`."""
        while True:
            with self.cond:
                seen = self.rounds
            target = directory().pick(model, tried, refresh=False, path=path)
            if target is not None:
                return target
            with self.cond:
                while self.rounds == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self.cond.wait(left)

    def _watch(self, app: Flask) -> None:
        """Re-read the replicas while anyone waits (one query per round for every waiter), then wake them."""
        while True:
            with self.cond:
                if self.count <= 0:
                    self.watching = False
                    return
                refresh = self.rounds % REFRESH_EVERY == 0
            if refresh:
                try:
                    with app.app_context():
                        directory().refresh(force=True)
                        db.session.remove()
                except Exception as exc:  # the next round tries again; waiters give up at their deadline
                    log.warning("gateway queue watcher: %s", exc)
            with self.cond:
                self.rounds += 1
                self.cond.notify_all()
            time.sleep(WATCH_EVERY_S)


_waiters = Waiters()


class Full(Exception):
    """This process already has as many cold-start waiters as it may."""


def wait_for_replica(
    model: str,
    timeout_s: float,
    tried: set[str] | None = None,
    path: str | None = None,
    service_id: str | None = None,
) -> Target | None:
    """Wait (bounded) for a replica of `model` that serves `path` and was not `tried`: the target, or None when none
    could take the request in time; raises Full when this process has no place left for another waiter (the caller
    answers 503 at once)."""
    app: Any = current_app._get_current_object()  # type: ignore[attr-defined]
    db.session.remove()  # give the request's database connection back before it waits
    if not _waiters.enter(limit(), app):
        raise Full(model)
    d = directory()
    counted = service_id is not None and d.redis is not None
    if counted:
        live.share(d.redis).waiting(str(service_id), 1)  # type: ignore[arg-type]
    try:
        return _waiters.wait_for(model, time.monotonic() + timeout_s, set(tried or ()), path)
    finally:
        _waiters.leave()
        if counted:
            live.share(d.redis).waiting(str(service_id), -1)  # type: ignore[arg-type]


SWEEP_ASK_MS = 500  # a request that finds no replica asks for a sweep at most this often (all web processes)


def wake(model: str) -> Service | None:
    """A model with no running replica: bring its service back (an idle one, or one scaled to zero: to
    max(1, min_replicas), recorded as a scaling event) and ask the reconciler now."""
    svc = db.session.scalar(
        db.select(Service)
        .join(Model)
        .where(Model.name == model, Service.status.not_in(("stopping", "stopped", "failed")))
        .order_by(Service.created_at.desc())
    )
    if svc is None:
        return None
    if svc.status == "idle" or svc.replicas == 0:
        wake_service(svc, "a request waits")
    directory().note_request(svc.id)
    ask_sweep()
    return svc


def ask_sweep() -> None:
    """Ask the reconciler for a sweep now: at most one per SWEEP_ASK_MS over every web process, however many requests
    find no replica (a sweep looks at every service: one serves them all)."""
    try:
        if not redis_client().set(names.SWEEP_ASKED_KEY, 1, nx=True, px=SWEEP_ASK_MS):
            return
    except redis.RedisError:
        pass  # asked anyway: without Redis no message reaches the control worker either
    try:
        sender().send_task(names.SERVICE_SWEEP, queue=names.CONTROL_QUEUE, priority=names.PRIORITIES["high"])
    except Exception:  # the beat sweep comes within seconds anyway
        pass


def wake_service(svc: Service, reason: str) -> None:
    """Start an idle service again (to at least one replica) in one conditional update: of several requests (in
    several processes) that wake it at once, one records the scaling event."""
    was, want = svc.replicas, max(1, int((svc.autoscaling or {}).get("min_replicas") or 0), svc.replicas)
    woke: Any = db.session.execute(
        db.update(Service)
        .where(Service.id == svc.id, (Service.status == "idle") | (Service.replicas == 0))
        .values(status="starting", status_message=f"starting: {reason}", replicas=want)
    )
    if woke.rowcount and was == 0:
        db.session.add(ScalingEvent(service_id=svc.id, from_replicas=0, to_replicas=want, direction="up",
                                    reason=f"from zero: {reason}", load={"waiting": 1}))  # fmt: skip
    db.session.commit()
    db.session.refresh(svc)
