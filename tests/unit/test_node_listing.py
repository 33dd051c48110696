"""`GET /nodes` builds its answer from rows (no ORM objects, no schema dump): the same answer as NodeSchema's dump of
the nodes, page by page and by status, with every node's GPUs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from gswarm_web.api.nodes import NodeSchema
from gswarm_web.control.nodes.state import apply_heartbeats
from gswarm_web.extensions import db
from gswarm_web.tables import Node
from tests.harness.app import bearer


def entry(ms: int, node: str, **data: Any) -> tuple[bytes, dict[bytes, bytes]]:
    payload = {
        "node": node,
        "hostname": f"h-{node}",
        "address": "10.0.0.1",
        "storage": {"disk": {"total_bytes": 9}},
    }
    return (f"{ms}-0".encode(), {b"node": node.encode(), b"data": json.dumps({**payload, **data}).encode()})


def gpu(i: int, **extra: Any) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{i}", "name": "H100", "memory_total_bytes": 80 * 2**30, **extra}


def without_age(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """seconds_since_seen moves with the clock: checked apart."""
    return [{k: v for k, v in n.items() if k != "seconds_since_seen"} for n in nodes]


def test_listing_is_the_schemas_dump(app: Flask, client: FlaskClient, admin_token: str) -> None:
    t = int(datetime.now(UTC).timestamp() * 1000)
    apply_heartbeats(
        [
            entry(t, "a8", cpu_count=64, cpu_percent=12, dram_total_bytes=2**40, dram_available_bytes=2**39,
                  gpus=[gpu(i, utilization_percent=50) for i in (7, 0, 3)], file_port=8470, started_at=t / 1000 - 5),
            entry(t - 60_000, "b-stale", cpu_percent=3.5, gpus=[gpu(0)], frames_dropped=4),
            entry(t, "c-none", state="stopped"),
            entry(t - 1000, "d", gpus=[gpu(1), gpu(0)]),
        ]
    )  # fmt: skip
    db.session.expire_all()
    orm = list(db.session.scalars(db.select(Node).order_by(Node.name)))
    want = NodeSchema(many=True).dump(orm)
    assert [g["index"] for g in want[0]["gpus"]] == [0, 3, 7]  # the check itself sees GPUs in index order

    got = client.get("/api/v1/nodes?per_page=500", headers=bearer(admin_token)).json
    assert got["total"] == 4 and got["page"] == 1 and got["per_page"] == 500
    assert without_age(got["nodes"]) == without_age(want)
    for n, w in zip(got["nodes"], want, strict=True):
        assert (
            isinstance(n["seconds_since_seen"], float)
            and abs(n["seconds_since_seen"] - w["seconds_since_seen"]) < 5
        )
    assert [n["status"] for n in got["nodes"]] == ["healthy", "unhealthy", "offline", "healthy"]

    page = client.get("/api/v1/nodes?per_page=2&page=2", headers=bearer(admin_token)).json
    assert (page["total"], page["page"], page["per_page"]) == (4, 2, 2)
    assert without_age(page["nodes"]) == without_age(want[2:])
    assert client.get("/api/v1/nodes?per_page=2&page=3", headers=bearer(admin_token)).json["nodes"] == []
    healthy = client.get("/api/v1/nodes?status=healthy", headers=bearer(admin_token)).json
    assert healthy["total"] == 2 and without_age(healthy["nodes"]) == without_age([want[0], want[3]])
    assert client.get("/api/v1/nodes?status=sick", headers=bearer(admin_token)).status_code == 422
