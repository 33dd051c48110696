"""The event stream at /api/v1/events on a real fleet, with a real WebSocket client: a step's status change arrives
within 1 s of its node reporting it, a socket without a valid token is refused, a read-only token may listen, and
the stream works under `gswarm up`'s gunicorn (gevent workers) and through config/nginx.conf."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket

from gswarm_web.cli.up import control_plane_specs
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import Proc, wait_for
from tests.integration.test_original_workflows import free_port
from tests.integration.test_slow_clients import nginx_conf

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("events"), nodes=("node1",)) as f:
        yield f


@pytest.fixture(scope="module")
def ws_url(fleet: Fleet) -> str:
    return fleet.serve_http().replace("http://", "ws://") + "/api/v1/events"


def token(fleet: Fleet, role: str) -> str:
    from gswarm_web.api.auth import create_token

    return create_token(f"events-{role}", role)


def connect(url: str, tok: str | None = None, first: dict[str, Any] | None = None) -> websocket.WebSocket:
    """A socket past its hello: the token in the upgrade's header, or in the first message as a browser sends it."""
    header = [f"Authorization: Bearer {tok}"] if tok and first is None else []
    ws = websocket.create_connection(url, header=header, timeout=10)
    if first is not None:
        ws.send(json.dumps(first))
    hello = json.loads(ws.recv())
    assert hello["type"] == "hello", hello
    return ws


def receive_until(
    ws: websocket.WebSocket, want: Callable[[dict[str, Any]], bool], timeout: float = 30
) -> Any:
    """(the first message `want` accepts, when it arrived)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws.settimeout(max(0.1, deadline - time.monotonic()))
        msg = json.loads(ws.recv())
        if want(msg):
            return msg, time.time()
    raise AssertionError("no such message in time")


def noop(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "node": "node1", "dependencies": list(deps), **kw}


def test_a_steps_status_change_arrives_within_a_second(fleet: Fleet, ws_url: str) -> None:
    ws = connect(ws_url, fleet.token)
    try:
        code, wf = fleet.post(
            "/workflows", {"name": "events", "actions": [noop("a", duration_s=1.5), noop("b", "a")]}
        )
        assert code == 201, wf
        msg, _ = receive_until(ws, lambda m: m["type"] == "workflow" and m["id"] == wf["id"])
        assert msg["status"] == "running"
        seen: dict[tuple[str, str], float] = {}
        for _ in range(4):
            msg, at = receive_until(ws, lambda m: m["type"] == "step" and m["workflow_id"] == wf["id"])
            seen[(msg["id"], msg["status"])] = at
            if (msg["id"], msg["status"]) == ("b", "succeeded"):
                break
        steps = {s["action_id"]: s for s in fleet.get(f"/workflows/{wf['id']}")[1]["steps"]}
        for aid, status, when in (("a", "running", "started_at"), ("a", "succeeded", "finished_at"),
                                  ("b", "succeeded", "finished_at")):  # fmt: skip
            reported = datetime.fromisoformat(steps[aid][when]).timestamp()  # the node's time of the change
            assert (aid, status) in seen, seen
            assert seen[(aid, status)] - reported < 1.0, (aid, status, seen[(aid, status)] - reported)
        msg, _ = receive_until(ws, lambda m: m["type"] == "workflow" and m["id"] == wf["id"])
        assert msg["status"] == "succeeded"
    finally:
        ws.close()


def test_a_socket_without_a_valid_token_is_refused(fleet: Fleet, ws_url: str) -> None:
    for header, status in (("Bearer not-a-token", 401), (f"Bearer {token(fleet, 'inference')}", 403)):
        with pytest.raises(websocket.WebSocketBadStatusException) as exc:
            websocket.create_connection(ws_url, header=[f"Authorization: {header}"], timeout=10)
        assert exc.value.status_code == status
        assert json.loads(exc.value.resp_body)["error"]["code"] in ("UNAUTHORIZED", "FORBIDDEN")
    for first in ({"token": "not-a-token"}, {"hello": "no token"}):
        ws = websocket.create_connection(ws_url, timeout=10)
        ws.send(json.dumps(first))
        msg = json.loads(ws.recv())
        assert msg["type"] == "error" and msg["error"]["code"] in ("UNAUTHORIZED", "INVALID_REQUEST"), msg
        opcode, data = ws.recv_data()
        assert opcode == websocket.ABNF.OPCODE_CLOSE and int.from_bytes(data[:2], "big") == 1008
        ws.close()
    r = requests.get(ws_url.replace("ws://", "http://"), headers=fleet.auth(), timeout=10)
    assert r.status_code == 400 and "is a WebSocket" in r.json()["error"]["message"]


def test_a_read_only_token_listens_to_the_types_it_asks_for(fleet: Fleet, ws_url: str) -> None:
    ws = connect(ws_url, first={"token": token(fleet, "read-only"), "types": ["step"]})
    try:
        code, wf = fleet.post("/workflows", {"name": "read-only", "actions": [noop("only")]})
        assert code == 201
        msg, _ = receive_until(ws, lambda m: m.get("workflow_id") == wf["id"] and m["status"] == "succeeded")
        assert msg["type"] == "step" and msg["id"] == "only"
        ws.settimeout(1.0)
        with pytest.raises(websocket.WebSocketTimeoutException):
            while True:  # nothing but steps: the workflow's own end is not sent to this socket
                assert json.loads(ws.recv())["type"] == "step"
    finally:
        ws.close()


def test_a_node_a_model_and_a_profiler_session_are_events(fleet: Fleet, ws_url: str, tmp_path: Path) -> None:
    ws = connect(ws_url, fleet.token, None)
    try:
        fleet.start("node3")  # its first heartbeat: a node event, no flush sees the upsert
        msg, _ = receive_until(ws, lambda m: m["type"] == "node" and m["id"] == "node3")
        assert msg["status"] == "healthy"
        code, body = fleet.post("/models", {"model_name": "evented", "model_type": "embedding",
                                            "source_url": "hf://org/evented"})  # fmt: skip
        assert code == 201, body
        msg, _ = receive_until(ws, lambda m: m["type"] == "model" and m["id"] == "evented")
        assert msg["status"] == "registered"
        code, body = fleet.post("/profiler/sessions", {"name": "evented-session"})
        assert code in (200, 201), body
        msg, _ = receive_until(ws, lambda m: m["type"] == "profiler_session" and m["id"] == "evented-session")
        assert msg["status"] == "active"
    finally:
        ws.close()
        fleet.procs.pop("node3").stop()


@pytest.fixture(scope="module")
def gunicorn(fleet: Fleet) -> Iterator[str]:
    """The API under gunicorn with the very command line `gswarm up` runs (gevent workers)."""
    port = free_port()
    web = next(
        s for s in control_plane_specs(fleet.settings, fleet.env, "127.0.0.1", port) if s.name == "web"
    )
    proc = Proc("web-events", list(web.argv), fleet.env, fleet.tmp / "logs").start()
    base = f"127.0.0.1:{port}"
    try:
        wait_for(
            lambda: requests.get(f"http://{base}/api/v1/health", timeout=2).status_code == 200, 60, "the API"
        )
        yield base
    finally:
        proc.stop()


def listeners_get_a_step(fleet: Fleet, url: str, n: int) -> None:
    """`n` sockets on `url` each see the same step end within 1 s of it; the API answers while they are open."""
    socks = [connect(url, first={"token": fleet.token, "types": ["step"]}) for _ in range(n)]
    try:
        code, wf = fleet.post("/workflows", {"name": "many", "actions": [noop("x")]})
        assert code == 201
        arrivals = [receive_until(ws, lambda m: m["workflow_id"] == wf["id"] and m["status"] == "succeeded")[1]
                    for ws in socks]  # fmt: skip
        step = fleet.get(f"/workflows/{wf['id']}")[1]["steps"][0]
        assert max(arrivals) - datetime.fromisoformat(step["finished_at"]).timestamp() < 1.0
        base = url.replace("ws://", "http://").removesuffix("/api/v1/events")
        assert requests.get(f"{base}/api/v1/health", timeout=2).status_code == 200
    finally:
        for ws in socks:
            ws.close()


def test_the_stream_works_under_gunicorn_gevent_workers(fleet: Fleet, gunicorn: str) -> None:
    listeners_get_a_step(fleet, f"ws://{gunicorn}/api/v1/events", 24)  # several per worker process


def test_the_stream_works_through_the_repos_nginx_config(fleet: Fleet, gunicorn: str, tmp_path: Path) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(nginx).exists(), (
        "nginx is not installed (apt-get install nginx-light; make bench installs it)"
    )
    port = free_port()
    conf = nginx_conf(tmp_path, port, gunicorn)
    assert "location = /api/v1/events" in conf.read_text(), (
        "config/nginx.conf has no `location = /api/v1/events` passing the WebSocket upgrade (Upgrade and "
        "Connection headers, proxy_read_timeout): nginx would send the stream's upgrade on as a plain GET"
    )
    argv = [nginx, "-p", f"{tmp_path}/", "-c", str(conf), "-e", "stderr", "-g", "daemon off;"]
    proxy = Proc("nginx-events", argv, fleet.env, tmp_path).start()
    try:
        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2).ok, 30, "nginx up")
        listeners_get_a_step(fleet, f"ws://127.0.0.1:{port}/api/v1/events", 4)
    finally:
        proxy.stop()


def test_upgrades_without_a_token_are_dropped_fast_and_bounded(fleet: Fleet, ws_url: str) -> None:
    from gswarm_web.api.events import AUTH_WAIT_S, MAX_UNAUTHENTICATED

    silent = [websocket.create_connection(ws_url, timeout=10) for _ in range(MAX_UNAUTHENTICATED)]
    t0 = time.monotonic()
    try:
        with pytest.raises(
            websocket.WebSocketBadStatusException
        ) as exc:  # one more: refused before the upgrade
            websocket.create_connection(ws_url, timeout=10)
        assert exc.value.status_code == 401 and "wait for their token" in exc.value.resp_body.decode()
        assert connect(ws_url, token(fleet, "read-only")) is not None  # a token on the upgrade still gets in
        for ws in silent:  # each silent one is closed once its wait is over
            msg = json.loads(ws.recv())
            assert msg["type"] == "error" and msg["error"]["code"] == "UNAUTHORIZED"
        assert time.monotonic() - t0 < AUTH_WAIT_S + 3
        # their places are free again: a browser's first message is taken
        assert connect(ws_url, first={"token": token(fleet, "read-only")}) is not None
    finally:
        for ws in silent:
            ws.close()
