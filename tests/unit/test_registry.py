"""Heartbeats into node rows, and status from last_seen (SQLite app)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from gswarm_web.control.nodes.state import apply_heartbeats, node_status, sweep
from gswarm_web.extensions import db
from gswarm_web.tables import Node, NodeGpu
from tests.harness.app import bearer


def entry(ms: int, node: str, **data: Any) -> tuple[bytes, dict[bytes, bytes]]:
    payload = {"node": node, "hostname": "h", "address": "10.0.0.1", "cpu_count": 8, "storage": {}, **data}
    return (f"{ms}-0".encode(), {b"node": node.encode(), b"data": json.dumps(payload).encode()})


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def test_heartbeat_creates_and_updates_a_node(app: Flask) -> None:
    t = now_ms()
    gpu = {
        "index": 0,
        "uuid": "GPU-1",
        "name": "H100",
        "memory_total_bytes": 80 * 10**9,
        "utilization_percent": 7,
    }
    assert (
        apply_heartbeats([entry(t - 1000, "n1", cpu_count=4), entry(t, "n1", cpu_count=8, gpus=[gpu])]) == 1
    )
    node = db.session.get(Node, "n1")
    assert node.cpu_count == 8  # the newest heartbeat of the batch wins
    assert [(g.index, g.name) for g in node.gpus] == [(0, "H100")]
    assert abs((node.last_seen - datetime.fromtimestamp(t / 1000, UTC)).total_seconds()) < 0.01
    # An older, redelivered heartbeat must not move last_seen back.
    apply_heartbeats([entry(t - 5000, "n1", cpu_count=2)])
    db.session.expire_all()
    assert db.session.get(Node, "n1").cpu_count == 8
    # The GPU goes away: its row goes too.
    apply_heartbeats([entry(t + 1000, "n1", gpus=[])])
    db.session.expire_all()
    assert db.session.scalars(db.select(NodeGpu)).all() == []


def test_malformed_heartbeats_are_dropped(app: Flask) -> None:
    bad = [
        (b"1-0", {b"data": b"not json"}),
        (b"2-0", {b"data": json.dumps({"node": "../x"}).encode()}),
        (b"3-0", {b"data": json.dumps({"node": "control"}).encode()}),
    ]
    assert apply_heartbeats(bad + [entry(now_ms(), "ok-node")]) == 1
    assert [n.name for n in db.session.scalars(db.select(Node))] == ["ok-node"]


def test_status_by_age_and_state() -> None:
    now = datetime.now(UTC)
    n = Node(name="x", state="up", last_seen=now - timedelta(seconds=5))
    assert node_status(n, now, 10, 60) == "healthy"
    n.last_seen = now - timedelta(seconds=11)
    assert node_status(n, now, 10, 60) == "unhealthy"
    n.last_seen = now - timedelta(seconds=61)
    assert node_status(n, now, 10, 60) == "offline"
    n.last_seen, n.state = now, "stopped"
    assert node_status(n, now, 10, 60) == "offline"


def test_nodes_api_filters_by_status(app: Flask, client: FlaskClient, admin_token: str) -> None:
    t = now_ms()
    apply_heartbeats(
        [
            entry(t, "fresh"),
            entry(t - 60_000, "stale"),
            entry(t - 600_000, "gone"),
            entry(t, "stopped-one", state="stopped"),
        ]
    )
    got = {}
    for status in ("healthy", "unhealthy", "offline"):
        r = client.get(f"/api/v1/nodes?status={status}", headers=bearer(admin_token))
        got[status] = sorted(n["name"] for n in r.json["nodes"])
        assert all(n["status"] == status for n in r.json["nodes"])
    assert got == {"healthy": ["fresh"], "unhealthy": ["stale"], "offline": ["gone", "stopped-one"]}
    page = client.get("/api/v1/nodes?per_page=2&page=2", headers=bearer(admin_token)).json
    assert page["total"] == 4 and page["page"] == 2 and len(page["nodes"]) == 2
    res = client.get("/api/v1/resources", headers=bearer(admin_token)).json
    assert res["nodes"]["fresh"]["compute"]["cpu"]["cores"] == 8


def test_sweep_records_transitions(app: Flask) -> None:
    t = now_ms()
    apply_heartbeats([entry(t - 60_000, "late")])
    assert sweep(30, 120) == [("late", "healthy", "unhealthy")]
    assert sweep(30, 120) == []
