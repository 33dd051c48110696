"""The gateway's shared in-flight counts and its connections to replicas, through the API under gunicorn as `gswarm up`
runs it (gevent workers), with keep-alive clients: after a burst every count is back at zero and every request was
measured, the replica saw a few reused connections rather than one per request, and the counts of a web process
killed with a request in flight are taken back. The replica is a small HTTP/1.1 server that answers embeddings (the
gateway is what is tested here, not a model); one input, `hold`, is answered only when the test says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from gswarm_tasks import names
from gswarm_web.cli.up import control_plane_specs
from tests.harness.app import bearer, build_app, make_settings
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # a gunicorn of its own on a port of its own, and a wait on a lease's expiry

CLIENTS, EACH = 8, 30


class Replica(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.release = threading.Event()

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1  # one per accepted connection (the server's own thread: no lock needed)
        super().process_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Replica

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("input") == ["hold"]:
            self.server.release.wait(60)
        data = json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
                           "usage": {"prompt_tokens": 3, "total_tokens": 3}}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway(fleet_env: dict[str, str], home: Path) -> Iterator[dict[str, Any]]:
    replica = Replica()
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    env = {**fleet_env, "GSWARM_HEARTBEAT_TIMEOUT": "3600"}  # the node row written below stays fresh
    settings = make_settings(
        home, **{k: v for k, v in env.items() if k.startswith("GSWARM_") and k != "GSWARM_HOME"}
    )
    app = build_app(settings)
    rid = str(uuid.uuid4())
    with app.app_context():
        from gswarm_web.api.auth import create_token
        from gswarm_web.extensions import db
        from gswarm_web.tables import Model, Node, Service
        from gswarm_web.tables import Replica as ReplicaRow

        model = Model(name="stub", model_type="embedding", status="ready")
        db.session.add_all([Node(name="n1", last_seen=datetime.now(UTC)), model])
        db.session.flush()
        svc = Service(id=str(uuid.uuid4()), model_id=model.id, device="n1:cpu", status="running", config={})
        db.session.add(svc)
        db.session.flush()
        db.session.add(ReplicaRow(id=rid, service_id=svc.id, node="n1", device="cpu", status="running",
                                  url=f"http://127.0.0.1:{replica.server_port}", engine="builtin"))  # fmt: skip
        db.session.commit()
        token, admin = create_token("apps", "inference"), create_token("ops", "admin")
        db.session.remove()
        db.engine.dispose()
    port = _free_port()
    web = next(s for s in control_plane_specs(settings, env, "127.0.0.1", port) if s.name == "web")
    proc = Proc("web", list(web.argv), env, home / "logs").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: requests.get(f"{url}/api/v1/health", timeout=2).status_code in (200, 503), 90, "the API"
        )
        client = redis.Redis.from_url(env["GSWARM_REDIS_URL"])
        yield {"url": url, "token": token, "admin": admin, "replica": replica, "rid": rid, "redis": client}
    finally:
        replica.release.set()
        proc.stop()
        replica.shutdown()


def _live(client: redis.Redis, rid: str) -> tuple[int, list[int]]:
    """(the gateway's count for the replica, every web process's own share of it)."""
    total = int(client.hget(names.SERVE_LIVE_KEY, f"r:{rid}") or 0)
    shares = [int(client.hget(names.SERVE_PROC_PREFIX + p.decode(), f"r:{rid}") or 0)
              for p in client.smembers(names.SERVE_PROCS_KEY)]  # fmt: skip
    return total, shares


def _requests_total(gateway: dict[str, Any]) -> dict[str, float]:
    """The replica's gswarm:requests_total samples on /metrics, by status code."""
    from prometheus_client.parser import text_string_to_metric_families

    token = gateway["admin"]
    text = requests.get(f"{gateway['url']}/metrics", headers=bearer(token), timeout=30).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "gswarm:requests")
    return {s.labels["code"]: s.value for s in family.samples if s.labels.get("replica") == gateway["rid"]}


def test_counts_return_to_zero_after_a_keep_alive_burst_over_reused_connections(
    gateway: dict[str, Any],
) -> None:
    assert _requests_total(gateway) == {"200": 0}  # a fresh replica has its series before its first answer
    answers: list[tuple[int, str]] = []

    def client() -> None:
        s = requests.Session()
        s.headers.update(bearer(gateway["token"]))
        for _ in range(EACH):
            r = s.post(f"{gateway['url']}/v1/embeddings", json={"model": "stub", "input": ["hi"]}, timeout=60)
            answers.append((r.status_code, r.headers.get("X-Gswarm-Replica", "")))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == [(200, gateway["rid"])] * (CLIENTS * EACH)
    client_ = gateway["redis"]
    stats = names.SERVE_STATS_PREFIX + gateway["rid"]
    # Every count-out arrives (off the responses' path) with its measure, and every count is back at zero.
    wait_for(lambda: int(client_.hget(stats, "n|200") or 0) == CLIENTS * EACH, 30, "every request measured")
    assert _live(client_, gateway["rid"]) == (0, [0] * len(client_.smembers(names.SERVE_PROCS_KEY)))
    assert int(client_.hget(stats, "e2e|n") or 0) == CLIENTS * EACH
    assert int(client_.hget(stats, "prompt") or 0) == 3 * CLIENTS * EACH
    # Connections to the replica are kept and reused: at most one per client in each of gunicorn's 4 processes.
    assert gateway["replica"].connections <= 4 * CLIENTS < CLIENTS * EACH
    assert _requests_total(gateway) == {"200": CLIENTS * EACH}


def test_a_killed_web_process_leaves_no_count_behind(gateway: dict[str, Any]) -> None:
    from gswarm_web.control.serving import live

    client_, rid = gateway["redis"], gateway["rid"]
    failed: list[str] = []

    def held() -> None:
        try:
            requests.post(f"{gateway['url']}/v1/embeddings", json={"model": "stub", "input": ["hold"]},
                          headers=bearer(gateway["token"]), timeout=60)  # fmt: skip
        except requests.RequestException as exc:
            failed.append(type(exc).__name__)

    t = threading.Thread(target=held)
    t.start()
    wait_for(lambda: _live(client_, rid)[0] == 1, 30, "the held request counted in flight")
    owner = next(p.decode() for p in client_.smembers(names.SERVE_PROCS_KEY)
                 if int(client_.hget(names.SERVE_PROC_PREFIX + p.decode(), f"r:{rid}") or 0) == 1)  # fmt: skip
    os.kill(int(owner.split("-")[-2]), signal.SIGKILL)  # the share's id: host-pid-nonce
    t.join(60)
    assert failed  # the client lost its answer with its web process
    assert _live(client_, rid)[0] == 1  # the count stays until the process's lease runs out
    wait_for(
        lambda: live.heal(client_) >= 0 and _live(client_, rid)[0] == 0,
        live.LEASE_S + 15,
        "counts taken back",
    )
    assert owner.encode() not in client_.smembers(names.SERVE_PROCS_KEY)
    assert not client_.exists(names.SERVE_PROC_PREFIX + owner)
