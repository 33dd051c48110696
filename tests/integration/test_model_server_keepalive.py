"""The built-in model server keeps connections alive (HTTP/1.1): answers, errors and streams on one connection, a
body the server did not read is skipped, the gateway's pool reuses connections (counted at the server), an idle
connection is closed after the server's --keep-alive-s, and SIGTERM does not wait for idle connections."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gswarm_tasks.serving.engines import KEY_HEADER
from gswarm_web.control.serving import table as routing
from gswarm_web.control.serving.table import replica_http
from tests.integration.test_model_server import KEY, Server, gt_minilm, tiny_lm

pytestmark = pytest.mark.serial  # waits on an idle timeout of the server's

IDLE_S = 1.0


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("keepalive")
    server = Server(
        Path(gt_minilm.get_model_path()), "minilm", where, "--keep-alive-s", str(IDLE_S), key=True
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def send(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
    raw = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    conn.request(method, path, body=raw, headers={"Content-Type": "application/json", KEY_HEADER: KEY})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data.startswith(b"{") else data, resp


def connections(server: Server) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        return int(send(conn, "GET", "/health")[1]["connections_total"])
    finally:
        conn.close()


def test_answers_and_errors_share_one_connection_and_unread_bodies_are_skipped(minilm: Server) -> None:
    before = connections(minilm)  # its own connection is counted in it
    conn = http.client.HTTPConnection("127.0.0.1", minilm.port, timeout=30)
    conn.connect()
    local = conn.sock.getsockname()
    asked = [
        ("POST", "/v1/embeddings", {"input": ["hello"]}, 200),
        ("POST", "/v1/embeddings", {"input": []}, 422),  # an error answer keeps the connection too
        (
            "POST",
            "/nowhere",
            b"x" * 50_000,
            404,
        ),  # a body the server never reads: skipped before the next request
        ("GET", "/v1/models", None, 200),
        ("POST", "/v1/embeddings", {"input": ["again", "twice"]}, 200),
    ]
    for method, path, body, want in asked:
        status, answer, resp = send(conn, method, path, body)
        assert status == want, (path, answer)
        assert resp.getheader("Connection") is None and resp.getheader("Content-Length") is not None
        assert conn.sock is not None and conn.sock.getsockname() == local, f"{path} closed the connection"
    assert len(answer["data"]) == 2
    assert send(conn, "GET", "/health")[1]["connections_total"] == before + 1
    conn.close()


def test_the_gateways_pool_reuses_connections_to_the_server(minilm: Server) -> None:
    http = replica_http()  # what a gateway web process sends requests to replicas with
    headers = {"Content-Type": "application/json", KEY_HEADER: KEY}
    url = minilm.url + "/v1/embeddings"
    before = connections(minilm)
    for i in range(20):
        resp = http.request("POST", url, body=json.dumps({"input": [f"text {i}"]}).encode(), headers=headers)
        assert resp.status == 200, resp.data
    assert connections(minilm) == before + 2  # one for the 20 requests, one for the count itself

    failures: list[str] = []

    def client() -> None:
        for i in range(10):
            resp = http.request(
                "POST", url, body=json.dumps({"input": [f"more {i}"]}).encode(), headers=headers
            )
            if resp.status != 200:
                failures.append(str(resp.data))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures
    grown = connections(minilm) - before - 3
    assert 0 <= grown <= 3, f"{grown} new connections for 40 requests from 4 threads (at most 3 more than 1)"


def test_the_gateways_pool_reconnects_a_connection_idle_past_its_reuse_bound(
    minilm: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    http = replica_http()
    headers = {"Content-Type": "application/json", KEY_HEADER: KEY}
    url = minilm.url + "/v1/embeddings"
    monkeypatch.setattr(routing, "REUSE_S", 0.0)  # every connection counts as idle too long
    before = connections(minilm)
    for i in range(3):
        resp = http.request("POST", url, body=json.dumps({"input": [f"text {i}"]}).encode(), headers=headers)
        assert resp.status == 200, resp.data
    assert connections(minilm) == before + 4  # a connection per request, and the count's own


def test_an_idle_connection_is_closed_after_the_timeout(minilm: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", minilm.port, timeout=30)
    assert send(conn, "GET", "/v1/models")[0] == 200
    answered = time.monotonic()
    sock = conn.sock
    sock.settimeout(IDLE_S + 20)
    assert sock.recv(1) == b""  # blocks until the server closes it (EOF), at most the deadline above
    idle = time.monotonic() - answered
    assert IDLE_S * 0.8 <= idle < IDLE_S + 10, idle
    conn.close()


def test_streams_are_chunked_on_a_kept_connection_and_sigterm_does_not_wait_for_idle_ones(
    tmp_path: Path,
) -> None:
    server = Server(tiny_lm(tmp_path), "tiny", tmp_path, "--keep-alive-s", "60", key=True)
    try:
        server.wait_ready()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {"prompt": "hello", "max_tokens": 4, "temperature": 0, "stream": True}
        status, data, resp = send(conn, "POST", "/v1/completions", body)
        assert status == 200 and resp.getheader("Transfer-Encoding") == "chunked", data
        assert data.rstrip().endswith(b"data: [DONE]")
        status, answer, _ = send(conn, "POST", "/v1/completions", {**body, "stream": False})
        assert status == 200 and answer["object"] == "text_completion"
        assert conn.sock is not None  # the connection is still open, idle, when the server is told to stop
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0, server.logs()
        assert time.monotonic() - t0 < 15, "the stop waited for the idle connection"
        conn.close()
    finally:
        server.stop()
