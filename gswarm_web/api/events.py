"""`/api/v1/events`: one WebSocket carrying the fleet's changes (nodes, tasks, workflows and their steps, services
and replicas, profiler sessions) as JSON messages, as `control.events` publishes them.

A socket authenticates like the API: `Authorization: Bearer <token>` on the upgrade request, or, for a browser
(which cannot set headers on a WebSocket), a first message `{"token": "..."}` within AUTH_WAIT_S; a `token` query
parameter works too, but lands in proxies' logs. Any role but `inference` may listen. `types` (a query parameter,
comma-separated, or a list in the first message) narrows what is sent. Each web process reads the channel once and
hands each message to its sockets; a socket that cannot keep up, or a channel that was away, gets
`{"type": "resync"}`: refetch, something was missed.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from typing import Any

import redis
from flask import Blueprint, Flask, Response, g, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed
from werkzeug.routing import WebsocketMismatch

from gswarm_tasks import names
from gswarm_tasks.errors import Forbidden, InvalidRequest, Unauthorized

from ..errors import error_response
from ..extensions import db, settings
from .auth import identity_of

log = logging.getLogger(__name__)

bp = Blueprint("events", __name__, url_prefix="/api/v1")
sock = Sock()
TYPES = ("node", "task", "workflow", "step", "service", "replica", "model", "profiler_session")
AUTH_WAIT_S = 3.0
# Sockets of this process waiting for their first message (no token yet): each holds a socket and a greenlet, so
# a flood of upgrades without a token is refused at once beyond this, before the upgrade.
MAX_UNAUTHENTICATED = 32
_unauthenticated = threading.BoundedSemaphore(MAX_UNAUTHENTICATED)
BACKLOG = 1000  # messages a socket may fall behind before it is told to resync
RECHECK_S = 30.0  # a revoked token's socket is closed within this (and auth's cache)
POLICY_VIOLATION = 1008


class Listener:
    """One socket's share of the channel: a bounded queue, and whether something was dropped."""

    def __init__(self, types: set[str]) -> None:
        self.types = types
        self.queue: queue.Queue[str] = queue.Queue(BACKLOG)
        self.lost = False

    def offer(self, kind: str, data: str) -> None:
        if self.types and kind not in self.types:
            return
        try:
            self.queue.put_nowait(data)
        except queue.Full:
            self.lost = True


class Hub:
    """This process's one subscription to the events channel, fanned out to its sockets."""

    def __init__(self) -> None:
        self.listeners: set[Listener] = set()
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.pid: int | None = None
        self.url = ""

    def join(self, url: str, types: set[str]) -> Listener:
        with self.lock:
            if self.pid != os.getpid():  # a forked worker starts its own reader
                self.pid, self.url, self.listeners = os.getpid(), url, set()
                self.ready.clear()
                threading.Thread(target=self._run, name="gswarm-events", daemon=True).start()
            listener = Listener(types)
            self.listeners.add(listener)
        self.ready.wait(5.0)
        return listener

    def leave(self, listener: Listener) -> None:
        with self.lock:
            self.listeners.discard(listener)

    def _fanout(self, data: str) -> None:
        try:
            kind = str(json.loads(data).get("type"))
        except (ValueError, AttributeError):
            return
        with self.lock:
            targets = list(self.listeners)
        for listener in targets:
            listener.offer(kind, data)

    def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                client = redis.Redis.from_url(self.url, socket_timeout=10, socket_connect_timeout=5)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(names.channel(names.EVENTS_CHANNEL, client))
                if self.ready.is_set():  # a reconnect: whatever was published meanwhile is lost
                    self._fanout(json.dumps({"type": "resync", "reason": "the event channel was away"}))
                self.ready.set()
                backoff = 0.5
                while True:
                    msg = pubsub.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        data = msg["data"]
                        self._fanout(data.decode() if isinstance(data, bytes) else str(data))
            except redis.RedisError as exc:
                log.warning("event channel lost (%s); reconnecting in %.1f s", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)


hub = Hub()


def _types(value: Any, where: str) -> set[str]:
    if value is None or value == "":
        return set()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
        raise InvalidRequest(f"{where}: a list of event types", {"field": where})
    wrong = sorted({t.strip() for t in items} - set(TYPES))
    if wrong:
        raise InvalidRequest(
            f"{where}: unknown event type {wrong[0]!r} (one of {', '.join(TYPES)})", {"field": where}
        )
    return {t.strip() for t in items}


def _identify(token: str) -> tuple[str, str]:
    """(role, name) of a token that may listen."""
    ident = identity_of(token)
    db.session.remove()  # a socket lives long: it holds no database connection while it waits
    if ident is None:
        raise Unauthorized("the bearer token is not valid")
    if ident[0] == "inference":
        raise Forbidden(
            "an inference token may only call the gateway (/v1), not the event stream", {"role": "inference"}
        )
    return ident.role, ident.name


@bp.before_request
def _upgrade_request() -> None:
    """Refuse before the upgrade what is refused anyway: unknown parameters, a token that is not valid."""
    unknown = sorted(set(request.args) - {"token", "types"})
    if unknown:
        raise InvalidRequest(
            f"{unknown[0]}: unknown query parameter of {request.path} (it takes token, types)",
            {"field": unknown[0], "location": "query"},
        )
    g.event_types = _types(request.args.get("types"), "types")
    scheme, _, header = request.headers.get("Authorization", "").partition(" ")
    token = header.strip() if scheme.lower() == "bearer" else request.args.get("token", "")
    g.event_token = token or None
    if token:
        g.role, g.token_name = _identify(token)
    elif _unauthenticated.acquire(blocking=False):
        g.event_waiting = True  # released when the request ends (teardown), whatever became of it
    else:
        raise Unauthorized(
            f"{MAX_UNAUTHENTICATED} sockets of this server already wait for their token: send it on the upgrade "
            "(Authorization: Bearer <token>)"
        )


@bp.teardown_request
def _release(_exc: BaseException | None) -> None:
    if g.pop("event_waiting", False):
        _unauthenticated.release()


def _first_message(ws: Any) -> tuple[str, set[str]]:
    """A browser's token (and types) in its first message; anything else closes the socket."""
    raw = ws.receive(timeout=AUTH_WAIT_S)
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("token"), str) or not doc["token"].strip():
        raise Unauthorized(
            f'a token is required: send {{"token": "<token>"}} first (within {AUTH_WAIT_S:.0f} s)'
        )
    extra = sorted(set(doc) - {"token", "types"})
    if extra:
        raise InvalidRequest(f"{extra[0]}: unknown field of the first message (it takes token, types)")
    return doc["token"].strip(), _types(doc.get("types"), "types")


def _refuse(ws: Any, exc: Unauthorized | Forbidden | InvalidRequest) -> None:
    ws.send(json.dumps({"type": "error", "error": exc.to_dict()}))
    ws.close(reason=POLICY_VIOLATION, message=exc.message[:120])


@sock.route("/events", bp=bp)
def events(ws: Any) -> None:
    """The event stream (WebSocket)."""
    token, types = g.event_token, g.event_types
    try:
        if token is None:
            token, types = _first_message(ws)
            g.role, g.token_name = _identify(token)
    except (Unauthorized, Forbidden, InvalidRequest) as exc:
        _refuse(ws, exc)
        return
    finally:
        _release(None)  # it waits no longer: its place is free for the next socket
    listener = hub.join(settings().effective_redis_url, types)
    try:
        hello = {"type": "hello", "role": g.role, "name": g.token_name, "types": sorted(types or TYPES)}
        ws.send(json.dumps({**hello, "time": time.time()}))
        _forward(ws, listener, token)
    except (Unauthorized, Forbidden) as exc:
        _refuse(ws, exc)
    except ConnectionClosed:
        pass
    finally:
        hub.leave(listener)


def _forward(ws: Any, listener: Listener, token: str) -> None:
    checked = time.monotonic()
    while True:
        try:
            data: str | None = listener.queue.get(timeout=1.0)
        except queue.Empty:
            data = None
        if listener.lost:
            listener.lost = False
            while not listener.queue.empty():
                listener.queue.get_nowait()
            ws.send(json.dumps({"type": "resync", "reason": "this socket fell behind"}))
            continue
        if data is not None:
            ws.send(data)
            continue
        ws.receive(timeout=0)  # raises ConnectionClosed once the client has gone; what it says is ignored
        if time.monotonic() - checked > RECHECK_S:
            _identify(token)
            checked = time.monotonic()


def init_events(app: Flask) -> None:
    """The WebSocket route (a plain blueprint: flask-smorest documents HTTP operations only)."""
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"ping_interval": 25, "max_message_size": 64 * 1024})
    app.register_blueprint(bp)
    sock.init_app(app)

    @app.errorhandler(WebsocketMismatch)
    def _not_a_websocket(_exc: WebsocketMismatch) -> Response:
        return error_response(
            400,
            "INVALID_REQUEST",
            f"{request.path} is a WebSocket: connect with `Upgrade: websocket` (ws:// or wss://)",
            {"field": "Upgrade", "location": "headers"},
        )
