"""Where the gateway sends a request: the running replicas of each served model, re-read every second from the
tables (a replica on a node that stopped heartbeating is left out at once), the requests each has in flight in
this process, and a short quarantine for a replica whose last request failed.

Requests go over a pool of keep-alive connections; a request's model is the `model` of its body.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
import urllib3

from gswarm_tasks import names

from ..extensions import db, redis_client, sender, settings
from ..tables import Model, Node, Replica, Service

REFRESH_S = 1.0
QUARANTINE_S = 5.0
LAST_REQUEST_EVERY_S = 1.0


@dataclass
class Target:
    replica_id: str
    service_id: str
    url: str


class Directory:
    """The replicas the gateway may use, per model name (one per web process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_model: dict[str, list[Target]] = {}
        self.services: dict[str, list[Service]] = {}
        self.loaded_at = 0.0
        self.in_flight: dict[str, int] = {}
        self.quarantined: dict[str, float] = {}
        self.noted: dict[str, float] = {}
        self.turn = itertools.count()
        self.http = urllib3.PoolManager(num_pools=64, maxsize=32, retries=False)

    def refresh(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.loaded_at < REFRESH_S:
            return
        s = settings()
        fresh = datetime.now(UTC) - timedelta(seconds=s.heartbeat_timeout_s)
        rows = db.session.execute(
            db.select(Replica.id, Replica.service_id, Replica.url, Model.name)
            .join(Service, Replica.service_id == Service.id)
            .join(Model, Service.model_id == Model.id)
            .join(Node, Node.name == Replica.node)
            .where(
                Replica.status == "running", Replica.url.is_not(None), Node.last_seen >= fresh, Node.state != "stopped"
            )
        ).all()
        by_model: dict[str, list[Target]] = {}
        for rid, sid, url, model in rows:
            by_model.setdefault(model, []).append(Target(rid, sid, url))
        db.session.rollback()  # a read: end the transaction so the next refresh sees new rows
        with self.lock:
            self.by_model, self.loaded_at = by_model, time.monotonic()

    def models(self) -> list[str]:
        self.refresh()
        served = set(self.by_model)
        served |= set(db.session.scalars(
            db.select(Model.name).join(Service).where(Service.status.not_in(("stopping", "stopped", "failed")))
        ))  # fmt: skip
        return sorted(served)

    def pick(self, model: str, tried: set[str]) -> Target | None:
        """The replica with the fewest requests in flight here (ties taken in turn), not tried and not quarantined."""
        self.refresh()
        now = time.monotonic()
        with self.lock:
            ok = [
                t
                for t in self.by_model.get(model, [])
                if t.replica_id not in tried and self.quarantined.get(t.replica_id, 0.0) <= now
            ]
            if not ok:
                return None
            fewest = min(self.in_flight.get(t.replica_id, 0) for t in ok)
            ties = [t for t in ok if self.in_flight.get(t.replica_id, 0) == fewest]
            best = ties[next(self.turn) % len(ties)]
            self.in_flight[best.replica_id] = self.in_flight.get(best.replica_id, 0) + 1
            return best

    def done(self, target: Target, failed: bool = False) -> None:
        with self.lock:
            self.in_flight[target.replica_id] = max(0, self.in_flight.get(target.replica_id, 1) - 1)
            if failed:
                self.quarantined[target.replica_id] = time.monotonic() + QUARANTINE_S
        self.note_request(target.service_id)

    def note_request(self, service_id: str) -> None:
        """The service was called (for idle unload); written at most once a second per service and process."""
        now = time.time()
        if now - self.noted.get(service_id, 0.0) < LAST_REQUEST_EVERY_S:
            return
        self.noted[service_id] = now
        try:
            redis_client().hset(names.SERVICE_LAST_REQUEST_KEY, service_id, now)
        except redis.RedisError:
            pass

    def wake(self, model: str) -> Service | None:
        """A model with no running replica: bring its service back (an idle one) and ask the reconciler now."""
        svc = db.session.scalar(
            db.select(Service)
            .join(Model)
            .where(Model.name == model, Service.status.not_in(("stopping", "stopped", "failed")))
            .order_by(Service.created_at.desc())
        )
        if svc is None:
            return None
        if svc.status == "idle":
            svc.status, svc.status_message = "starting", "starting for a request"
            db.session.commit()
        self.note_request(svc.id)
        try:
            sender().send_task(names.SERVICE_SWEEP, queue=names.CONTROL_QUEUE, priority=names.PRIORITIES["high"])
        except Exception:  # the beat sweep comes within seconds anyway
            pass
        return svc


_directory: Directory | None = None
_lock = threading.Lock()


def directory() -> Directory:
    global _directory
    with _lock:
        if _directory is None:
            _directory = Directory()
        return _directory


def forward(target: Target, path: str, body: bytes, headers: dict[str, str], stream: bool) -> Any:
    """Send one request to a replica; the urllib3 response (not read yet when `stream`)."""
    return directory().http.request(
        "POST",
        target.url.rstrip("/") + path,
        body=body,
        headers=headers,
        preload_content=not stream,
        timeout=urllib3.Timeout(connect=2.0, read=600.0),
    )
