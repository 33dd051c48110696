"""Where the gateway sends a request: the running replicas of each served model, re-read from the tables whenever
the replicas' version changes (every pick answers it), when the heartbeat read of one of their nodes would go stale
(a replica on a node that stopped heartbeating is left out at once), and at least every REFRESH_MAX_S; the
requests each has in flight in the whole gateway (`control/live.py`: every web process's, in Redis; this
process's own when Redis is away), and a short quarantine for a replica whose last request failed.

A service chooses how its requests are shared (`config.load_balancing`, the rule in `pick.py`): `least_requests` (the
replica with the fewest in flight, ties in turn; the default) or `round_robin` (each replica in turn);
`config.timeout` is how long a replica has to answer one and `config.max_in_flight` how many requests a replica takes
at once (the rest wait in the gateway's queue). A replica gets only the routes its engine serves. Requests go over a
pool of keep-alive connections per replica and web process (a replica that closes each connection, as the built-in
server's does, costs a connect per request; one to an IP address asks no resolver: under gevent each lookup went
through a thread pool); a request's model is the `model` of its body.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
import urllib3
from flask import current_app
from sqlalchemy import select
from sqlalchemy.orm import Session, scoped_session

from gswarm_tasks import names
from gswarm_tasks.serving.engines import OPENAI_ROUTES, key_headers, presets
from gswarm_tasks.settings import Settings

from ...extensions import db, redis_client, settings
from ...tables import Model, Node, Replica, Service
from . import live
from . import stats as serve_stats
from .config import LOAD_BALANCING
from .pick import choose
from .stats import Outcome, stats_key

REFRESH_S = 1.0  # with no replica in the table: how often it is read again
REFRESH_MAX_S = (
    3.0  # the longest a table is kept when no replica started or stopped (a service's config may change)
)
QUARANTINE_S = 5.0
LAST_REQUEST_EVERY_S = 1.0
READ_TIMEOUT_S = 600.0
REUSE_S = (
    4.0  # a connection idle longer is not reused: engines close idle ones (uvicorn, as vLLM runs it, at 5 s)
)
LIVE_SERVICE = (
    "stopping",
    "stopped",
    "failed",
)  # the statuses of a service that answers no more (not_in: live)


class ReplicaConnection(urllib3.connection.HTTPConnection):
    """urllib3's connection, connecting to an IP address without getaddrinfo (a name still goes through it)."""

    def _new_conn(self) -> socket.socket:
        try:
            ip = ipaddress.ip_address(self._dns_host)
        except ValueError:
            return super()._new_conn()
        sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
        try:
            for option in self.socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(self.timeout if isinstance(self.timeout, int | float) else None)
            sock.connect((str(ip), self.port))
        except TimeoutError as exc:
            sock.close()
            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"Connection to {self.host} timed out"
            ) from exc
        except OSError as exc:
            sock.close()
            raise urllib3.exceptions.NewConnectionError(
                self, f"Failed to establish a new connection: {exc}"
            ) from exc
        return sock


class ReplicaPool(urllib3.HTTPConnectionPool):
    """Keep-alive connections to one replica; one idle past REUSE_S is reconnected rather than raced against the
    replica's own idle close (a request sent as it closes would fail, and quarantine a healthy replica)."""

    ConnectionCls = ReplicaConnection

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        if time.monotonic() - getattr(conn, "gswarm_idle_since", float("inf")) > REUSE_S:
            conn.close()  # the request connects it again
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            conn.gswarm_idle_since = time.monotonic()
        super()._put_conn(conn)


def replica_http() -> urllib3.PoolManager:
    """Keep-alive connections to replicas, a pool per replica (host and port), for one web process."""
    http = urllib3.PoolManager(num_pools=64, maxsize=32, retries=False)
    http.pool_classes_by_scheme = {**http.pool_classes_by_scheme, "http": ReplicaPool}
    return http


@dataclass
class Target:
    replica_id: str
    service_id: str
    url: str
    headers: dict[str, str] = field(
        default_factory=dict
    )  # the replica's service key, as its server checks it
    timeout_s: float = READ_TIMEOUT_S
    routes: tuple[str, ...] = OPENAI_ROUTES  # what its engine serves
    node: str = ""


@dataclass
class Policy:
    """How a model's requests are shared: its service's load balancing and per-replica bound (0: none)."""

    load_balancing: str = LOAD_BALANCING[0]
    max_in_flight: int = 0


class Directory:
    """The replicas the gateway may use, per model name (one per app and web process: `directory()`). It reads the
    tables with `session` (a session, or a scoped one that gives each app context its own), the replicas' version,
    keys and live counts with `client` (None: this process's own counts only), and the heartbeat timeout and the
    engines' presets from `settings`."""

    def __init__(
        self, session: Session | scoped_session[Any], client: redis.Redis | None, settings: Settings
    ) -> None:
        self.session = session
        self.redis = client
        self.settings = settings
        self.lock = threading.Lock()
        self.by_model: dict[str, list[Target]] = {}
        self.loaded_at = 0.0
        self.due = 0.0  # monotonic time of the next re-read when nothing changed
        self.version = ""  # the replicas' version the last refresh saw; another from a pick: refresh
        self.stale = False
        self.in_flight: dict[str, int] = {}  # this process's own (routing falls back on it without Redis)
        self.quarantined: dict[str, float] = {}
        self.noted: dict[str, float] = {}
        self.policy: dict[str, str] = {}  # model -> load_balancing of its service
        self.limits: dict[str, Policy] = {}
        self.rounds: dict[str, int] = {}  # model -> the turn of its next pick made here (without Redis)
        self.http = replica_http()
        self.known_keys: dict[str, str] = {}
        self.redis_down_until = 0.0
        self.aliases: dict[str, str] = {}  # another name a service answers to -> its model

    def refresh(self, force: bool = False) -> None:
        if not force and not self.stale and time.monotonic() < self.due:
            return
        s = self.settings
        now, read_at = datetime.now(UTC), time.monotonic()
        fresh = now - timedelta(seconds=s.heartbeat_timeout_s)
        version = self._version()
        rows = self.session.execute(
            select(
                Replica.id,
                Replica.service_id,
                Replica.url,
                Replica.node,
                Replica.engine,
                Model.name,
                Service.config,
                Service.backend,
                Node.last_seen,
            )  # fmt: skip
            .join(Service, Replica.service_id == Service.id)
            .join(Model, Service.model_id == Model.id)
            .join(Node, Node.name == Replica.node)
            .where(
                Replica.status == "running",
                Replica.url.is_not(None),
                Node.last_seen >= fresh,
                Node.state != "stopped",
            )
        ).all()
        aliases = self._read_aliases()
        self.session.rollback()  # a read: end the transaction (and give its connection back) before Redis
        keys = self.keys()
        offered = presets(s.serve_engines)
        by_model: dict[str, list[Target]] = {}
        limits: dict[str, Policy] = {}
        due = read_at + (REFRESH_MAX_S if rows else REFRESH_S)
        for rid, sid, url, node, engine, model, config, backend, seen in sorted(rows, key=lambda r: r[0]):
            due = min(due, read_at + (seen - fresh).total_seconds())  # when this read of the node goes stale
            config = config or {}
            preset = offered.get(engine or backend)
            routes = preset.routes if preset is not None else OPENAI_ROUTES
            timeout = float(config.get("timeout") or READ_TIMEOUT_S)
            by_model.setdefault(model, []).append(Target(rid, sid, url, key_headers(keys.get(url)), timeout, routes,
                                                         node))  # fmt: skip
            limits.setdefault(model, Policy(str(config.get("load_balancing") or LOAD_BALANCING[0]),
                                            int(config.get("max_in_flight") or 0)))  # fmt: skip
        with self.lock:
            self.by_model, self.limits, self.loaded_at, self.due = by_model, limits, read_at, due
            self.aliases = aliases
            self.policy = {m: p.load_balancing for m, p in limits.items()}
            self.version, self.stale = version, False

    def _version(self) -> str:
        try:
            raw = self.redis.get(names.SERVE_VERSION_KEY) if self.redis is not None else None
        except redis.RedisError:
            return ""
        return raw.decode() if isinstance(raw, bytes) else str(raw or "0")

    def keys(self) -> dict[str, str]:
        """Every replica's service key by URL (as its node recorded it); the last ones read if Redis is away."""
        if self.redis is None:
            return self.known_keys
        try:
            raw: Any = self.redis.hgetall(names.SERVICE_KEYS_KEY)
        except redis.RedisError:
            return self.known_keys
        self.known_keys = {k.decode(): v.decode() for k, v in raw.items()}
        return self.known_keys

    def models(self) -> list[str]:
        """Every name the gateway answers to: the served models and their services' aliases."""
        self.refresh()
        served = set(self.by_model) | set(self.aliases)
        live = select(Model.name).join(Service).where(Service.status.not_in(LIVE_SERVICE))
        served |= set(self.session.scalars(live))
        return sorted(served)

    def real_name(self, name: str) -> str:
        """The model a name means: itself, or the model of the service it is an alias of."""
        self.refresh()
        return self.aliases.get(name, name)

    def _read_aliases(self) -> dict[str, str]:
        rows = self.session.execute(
            select(Model.name, Service.config).join(Service).where(Service.status.not_in(LIVE_SERVICE))
        ).all()
        return {alias: model for model, config in rows for alias in (config or {}).get("aliases") or ()}

    def serves(self, model: str, path: str) -> bool | None:
        """Whether the model's running replicas serve `path` (None: none is running to ask)."""
        targets = self.by_model.get(model)
        return None if not targets else any(path in t.routes for t in targets)

    def pick(
        self, model: str, tried: set[str], refresh: bool = True, path: str | None = None
    ) -> Target | None:
        """A replica not tried, not quarantined, not draining and under the service's `max_in_flight`: the next in
        turn for a round_robin service, else the one with the fewest requests in flight (ties taken in turn)."""
        if refresh:
            self.refresh()
        now = time.monotonic()
        with self.lock:
            ok = [
                t
                for t in self.by_model.get(model, [])
                if t.replica_id not in tried
                and self.quarantined.get(t.replica_id, 0.0) <= now
                and (path is None or path in t.routes)
            ]
            limits = self.limits.get(model, Policy(self.policy.get(model, LOAD_BALANCING[0])))
        if not ok:
            return None
        if self.redis is not None and now >= self.redis_down_until:
            try:
                return self._pick_shared(model, ok, limits)
            except redis.RedisError:
                self.redis_down_until = now + QUARANTINE_S  # routed on this process's counts meanwhile
        return self._pick_local(model, ok, limits)

    def _pick_shared(self, model: str, ok: list[Target], limits: Policy) -> Target | None:
        assert self.redis is not None
        share, ids = live.share(self.redis), [t.replica_id for t in ok]
        # no round trip when the service has no bound to hold across processes and the shared counts are fresh
        got = None if limits.max_in_flight else share.pick_local(model, limits.load_balancing, ids)
        chosen, version = got or share.pick(model, limits.load_balancing, limits.max_in_flight, ids)
        if version != self.version:
            self.stale = True  # a replica started or stopped: the next pick re-reads the tables
        best = next((t for t in ok if t.replica_id == chosen), None)
        if best is not None:
            with self.lock:
                self.in_flight[best.replica_id] = self.in_flight.get(best.replica_id, 0) + 1
        return best

    def _pick_local(self, model: str, ok: list[Target], limits: Policy) -> Target | None:
        """The shared pick's rule (`pick.choose`) on this process's own counts, with a turn of its own."""
        with self.lock:
            turn = self.rounds.get(model, 0)
            self.rounds[model] = turn + 1
            ids = [t.replica_id for t in ok]
            chosen = choose(ids, self.in_flight, limits.load_balancing, turn, cap=limits.max_in_flight)
            best = next((t for t in ok if t.replica_id == chosen), None)
            if best is not None:
                self.in_flight[best.replica_id] = self.in_flight.get(best.replica_id, 0) + 1
            return best

    def done(self, target: Target, outcome: Outcome | None = None, failed: bool = False) -> None:
        """A request left its replica: counted out (here and in the shared counts), measured, and a replica that
        failed it set aside for QUARANTINE_S."""
        with self.lock:
            self.in_flight[target.replica_id] = max(0, self.in_flight.get(target.replica_id, 1) - 1)
            if failed:
                self.quarantined[target.replica_id] = time.monotonic() + QUARANTINE_S
        if self.redis is not None and time.monotonic() >= self.redis_down_until:
            share = live.share(self.redis)  # sent off the response's path, batched (live.Share.count_out)
            keys = [stats_key(target.replica_id), names.SERVE_LIVE_KEY, share.key]
            share.count_out(keys, [f"r:{target.replica_id}", *(outcome or Outcome(0, 0.0)).args()])
        self.note_request(target.service_id)

    def rejected(self, service_id: str, reason: str) -> None:
        """A request of the service got no replica: `rejected` (the queue was full) or `timeouts`."""
        try:
            if self.redis is not None:
                serve_stats.rejected(self.redis, service_id, reason)
        except redis.RedisError:
            pass

    def note_request(self, service_id: str) -> None:
        """The service was called (for idle unload); written at most once a second per service and process."""
        now = time.time()
        if now - self.noted.get(service_id, 0.0) < LAST_REQUEST_EVERY_S:
            return
        self.noted[service_id] = now
        try:
            if self.redis is not None:
                self.redis.hset(names.SERVICE_LAST_REQUEST_KEY, service_id, now)
        except redis.RedisError:
            pass


EXTENSION = "gswarm_directory"  # the app's table, under its `extensions`
_lock = threading.Lock()


def directory() -> Directory:
    """The current app's table, made at its first use in this process with the app's database session (scoped to
    each app context), Redis client and settings."""
    extensions = current_app.extensions
    found: Directory | None = extensions.get(EXTENSION)
    if found is None:
        with _lock:
            found = extensions.get(EXTENSION)
            if found is None:
                found = extensions[EXTENSION] = Directory(db.session, redis_client(), settings())
    return found
