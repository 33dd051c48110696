"""The data pool on real workers (two nodes): create from base64, a local HTTP server and a file; dedup;
verified transfers and moves (a corrupted source fails with nothing recorded); content with ranges; pins;
the collector; DRAM eviction; refusals that write nothing."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

DRAM_CAPACITY = 8_000_000


GATE = threading.Event()


class GatedHandler(SimpleHTTPRequestHandler):
    """Files from a directory; paths under /gated/ wait until GATE is set (a download that is under way)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/gated/"):
            GATE.wait(60)
            self.path = self.path.removeprefix("/gated")
        super().do_GET()


@pytest.fixture(scope="module")
def web_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A plain local HTTP server: the allowed `http://` data source."""
    root = tmp_path_factory.mktemp("web")
    handler = partial(GatedHandler, directory=str(root))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield root, int(httpd.server_address[1])
    finally:
        GATE.set()
        httpd.shutdown()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, web_root: tuple[Path, int]) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("data")
    (tmp / "allowed").mkdir()
    with running_fleet(
        tmp,
        extra_env={
            "GSWARM_MODELS_ALLOWED_ROOTS": str(tmp / "allowed"),
            "GSWARM_DATA_ALLOWED_HOSTS": f"127.0.0.1:{web_root[1]}",
            "GSWARM_DATA_DRAM_CAPACITY": str(DRAM_CAPACITY),
            "GSWARM_DATA_INTERMEDIATE_TTL": "1",
        },
    ) as f:
        yield f


def created(fleet: Fleet, body: dict) -> dict:
    code, resp = fleet.post("/data", body)
    assert code in (200, 202), resp
    if resp.get("task_id"):
        task = fleet.wait_task(resp["task_id"])
        assert task["status"] == "succeeded", task
    return fleet.get(f"/data/{resp['chunk_id']}")[1] | {"deduplicated": resp["deduplicated"]}


def test_base64_chunk_lands_on_the_tier_and_equal_content_is_stored_once(fleet: Fleet) -> None:
    raw = os.urandom(100_000)
    body = {
        "data": base64.b64encode(raw).decode(),
        "device": "node1:dram",
        "type": "input",
        "format": "bytes",
    }
    chunk = created(fleet, body)
    assert chunk["status"] == "available" and chunk["size"] == len(raw)
    assert chunk["metadata"]["created_by"] == "api:fleet"  # the name of the token that made it
    assert chunk["metadata"]["checksum"] == hashlib.sha256(raw).hexdigest()
    assert [loc["device"] for loc in chunk["locations"]] == ["node1:dram"]
    stored = fleet.dram("node1") / "data" / chunk["chunk_id"]
    assert stored.read_bytes() == raw
    again = created(fleet, {**body, "type": "intermediate", "metadata": {"who": "second"}})
    assert (
        again["deduplicated"] is True and again["chunk_id"] != chunk["chunk_id"]
    )  # its own chunk, shared bytes
    assert again["chunk_type"] == "intermediate" and again["metadata"]["who"] == "second"
    assert (
        chunk["chunk_type"] == "input" and "who" not in fleet.get(f"/data/{chunk['chunk_id']}")[1]["metadata"]
    )
    assert (fleet.dram("node1") / "data" / again["chunk_id"]).stat().st_ino == stored.stat().st_ino
    other_tier = created(fleet, {**body, "device": "node1:disk"})
    assert other_tier["deduplicated"] is False  # bytes are shared per device
    listed = fleet.get("/data?device=node1:dram")[1]
    assert {c["chunk_id"] for c in listed["chunks"]} == {chunk["chunk_id"], again["chunk_id"]}
    code, _ = fleet.api("DELETE", f"/data/{chunk['chunk_id']}")  # one owner's delete leaves the other's bytes
    assert code == 202
    wait_for(lambda: fleet.get(f"/data/{chunk['chunk_id']}")[0] == 404, 30, "the first chunk deleted")
    assert (fleet.dram("node1") / "data" / again["chunk_id"]).read_bytes() == raw
    r = fleet.client.get(f"/api/v1/data/{again['chunk_id']}/content", headers=fleet.auth())
    assert r.status_code == 200 and r.data == raw


def test_chunk_from_a_file_and_delete(fleet: Fleet) -> None:
    src = fleet.tmp / "allowed" / "input.jsonl"
    src.write_text('{"text": "hello"}\n')
    chunk = created(fleet, {"source": f"file://{src}", "device": "node1:disk"})
    stored = fleet.storage("node1") / "data" / chunk["chunk_id"]
    assert stored.read_text() == src.read_text()
    code, resp = fleet.api("DELETE", f"/data/{chunk['chunk_id']}")
    assert code == 202
    for tid in resp["tasks"]:
        fleet.wait_task(tid)
    wait_for(lambda: fleet.get(f"/data/{chunk['chunk_id']}")[0] == 404, 10, "the chunk to be gone")
    assert not stored.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": "s3://bucket/x", "device": "node1:dram"}, "source"),
        ({"source": "file:///etc/passwd", "device": "node1:dram"}, "source"),
        ({"data": "not base64!", "device": "node1:dram"}, "data"),
        ({"data": "aGk=", "device": "node1:gpu0"}, "device"),
        ({"data": "aGk=", "device": "node1/../x:dram"}, "device"),
        ({"data": "aGk=", "source": "file:///x", "device": "node1:dram"}, "data"),
        ({"data": "A" * (23 * 1024 * 1024), "device": "node1:dram"}, "data"),  # 17.25 MiB once decoded
        ({"source": "ftp://127.0.0.1/x", "device": "node1:dram"}, "source"),
        ({"source": "http://example.com/x.bin", "device": "node1:dram"}, "source"),
        ({"source": "http://localhost:1/x.bin", "device": "node1:dram"}, "source"),
        ({"source": "file:///nonexistent-root/../etc/passwd", "device": "node1:dram"}, "source"),
        ({"source": "file:///{allowed}/../../etc/passwd", "device": "node1:disk"}, "source"),
        ({"data": "aGk=", "device": "node1:dram", "type": "scratch"}, "type"),
    ],
)
def test_bad_chunks_are_refused_and_nothing_is_written(fleet: Fleet, body: dict, field: str) -> None:
    def snapshot() -> tuple[set[str], int]:
        files = {
            str(p)
            for root in (fleet.storage("node1"), fleet.dram("node1"))
            for p in root.rglob("*")
            if "data" in p.parts
        }
        return files, fleet.get("/data")[1]["total"]

    if "source" in body:
        body = {**body, "source": body["source"].replace("/{allowed}", str(fleet.tmp / "allowed"))}
    before = snapshot()
    code, resp = fleet.post("/data", body)
    assert code == 422, resp
    message = resp["error"]["message"]
    assert message.startswith(f"{field}:") or message.startswith(f"invalid request: {field}:"), resp
    assert snapshot() == before


def test_unknown_chunk_is_404(fleet: Fleet) -> None:
    assert fleet.get("/data/nope")[0] == 404


def wait_ok(fleet: Fleet, task_id: str, timeout: float = 60) -> dict:
    task = fleet.wait_task(task_id, timeout)
    assert task["status"] == "succeeded", task.get("error")
    return task


def devices(fleet: Fleet, chunk_id: str) -> list[str]:
    return [loc["device"] for loc in fleet.get(f"/data/{chunk_id}")[1]["locations"]]


def test_chunk_from_an_allowed_http_host(fleet: Fleet, web_root: tuple[Path, int]) -> None:
    root, port = web_root
    raw = os.urandom(300_000)
    (root / "in.bin").write_bytes(raw)
    chunk = created(
        fleet, {"source": f"http://127.0.0.1:{port}/in.bin", "device": "node2:disk", "format": "bytes"}
    )
    assert chunk["size"] == len(raw) and chunk["metadata"]["checksum"] == hashlib.sha256(raw).hexdigest()
    assert (fleet.storage("node2") / "data" / chunk["chunk_id"]).read_bytes() == raw
    code, resp = fleet.post(
        "/data", {"source": f"http://127.0.0.1:{port}/missing.bin", "device": "node2:disk"}
    )
    assert code == 202
    task = fleet.wait_task(resp["task_id"])
    assert task["status"] == "failed" and task["error"]["code"] == "NOT_FOUND", task
    failed = fleet.get(f"/data/{resp['chunk_id']}")[1]
    assert failed["status"] == "failed" and failed["locations"] == []
    assert not list((fleet.storage("node2") / "data").glob(f"*{resp['chunk_id']}*"))


def test_transfer_is_verified_and_content_is_served_with_ranges(fleet: Fleet) -> None:
    raw = os.urandom(5_000_000)
    src = fleet.tmp / "allowed" / "five.bin"
    src.write_bytes(raw)
    chunk = created(fleet, {"source": f"file://{src}", "device": "node1:disk"})
    cid = chunk["chunk_id"]
    code, op = fleet.post(f"/data/{cid}/transfer", {"target_node": "node2", "target_device": "dram"})
    assert code == 202 and op["source_device"] == "node1:disk" and op["target_device"] == "node2:dram", op
    wait_ok(fleet, op["task_id"])
    assert devices(fleet, cid) == ["node1:disk", "node2:dram"]
    assert (fleet.dram("node2") / "data" / cid).read_bytes() == raw
    again = fleet.post(f"/data/{cid}/transfer", {"target_device": "node2:dram"})
    assert again[0] == 200 and again[1]["noop"] is True and again[1]["task_id"] is None
    r = fleet.client.get(f"/api/v1/data/{cid}/content", headers=fleet.auth())
    assert r.status_code == 200 and r.data == raw and r.headers["Accept-Ranges"] == "bytes"
    r = fleet.client.get(f"/api/v1/data/{cid}/content", headers={**fleet.auth(), "Range": "bytes=1000-1999"})
    assert r.status_code == 206 and r.data == raw[1000:2000]
    assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(raw)}"
    for bad in ("bytes=9999999-", "bytes=abc", "bytes=0-1,5-6"):
        r = fleet.client.get(f"/api/v1/data/{cid}/content", headers={**fleet.auth(), "Range": bad})
        assert r.status_code == 416 and r.get_json()["error"]["code"] == "INVALID_REQUEST", (bad, r.data)
    meta = fleet.get(f"/data/{cid}")[1]["metadata"]
    assert meta["access_count"] == 2 and meta["last_accessed"] is not None
    # delete_source: the copy moves to node2's disk and node1's copy goes
    code, op = fleet.post(f"/data/{cid}/transfer", {"target_device": "node2:disk", "delete_source": True})
    assert code == 202 and op["source_device"] == "node2:dram", op  # the closest copy is the source
    wait_ok(fleet, op["task_id"])
    wait_for(lambda: devices(fleet, cid) == ["node1:disk", "node2:disk"], 20, "node2:dram copy removed")
    assert not (fleet.dram("node2") / "data" / cid).exists()


def test_a_corrupted_source_fails_the_transfer_and_nothing_is_recorded(fleet: Fleet) -> None:
    raw = os.urandom(3_000_000)
    chunk = created(fleet, {"data": base64.b64encode(raw).decode(), "device": "node1:disk"})
    cid = chunk["chunk_id"]
    stored = fleet.storage("node1") / "data" / cid
    stored.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))  # same size, one byte flipped
    code, op = fleet.post(f"/data/{cid}/transfer", {"target_node": "node2", "target_device": "disk"})
    assert code == 202
    task = fleet.wait_task(op["task_id"])
    assert task["status"] == "failed" and "blake3" in task["error"]["message"], task
    assert devices(fleet, cid) == ["node1:disk"]
    assert not (fleet.storage("node2") / "data" / cid).exists()
    assert not list((fleet.storage("node2") / ".staging").glob("chunk-*"))


def test_move_between_tiers_of_a_node(fleet: Fleet) -> None:
    raw = os.urandom(50_000)
    chunk = created(fleet, {"data": base64.b64encode(raw).decode(), "device": "node2:disk"})
    cid = chunk["chunk_id"]
    code, resp = fleet.post(f"/data/{cid}/move", {"target_device": "node1:dram"})
    assert code == 422 and resp["error"]["message"].startswith("target_device"), resp
    code, resp = fleet.post(f"/data/{cid}/move", {"target_device": "gpu0"})
    assert code == 422 and resp["error"]["message"].startswith("target_device"), resp
    code, op = fleet.post(f"/data/{cid}/move", {"target_device": "dram"})
    assert code == 202, op
    wait_ok(fleet, op["task_id"])
    assert devices(fleet, cid) == ["node2:dram"]
    assert (fleet.dram("node2") / "data" / cid).read_bytes() == raw
    assert not (fleet.storage("node2") / "data" / cid).exists()


def test_pins_block_delete_unless_forced(fleet: Fleet) -> None:
    chunk = created(fleet, {"data": base64.b64encode(b"keep me").decode(), "device": "node1:disk"})
    cid = chunk["chunk_id"]
    code, body = fleet.post(f"/data/{cid}/pins", {"holder": "team-a"})
    assert code == 201 and body["references"] == ["pin:team-a"]
    code, resp = fleet.api("DELETE", f"/data/{cid}")
    assert code == 409 and resp["error"]["details"]["references"] == ["pin:team-a"]
    assert (fleet.storage("node1") / "data" / cid).exists()
    assert fleet.api("DELETE", f"/data/{cid}/pins/team-a")[0] == 200
    pinned_again = fleet.post(f"/data/{cid}/pins", {"holder": "team-b"})[1]
    assert pinned_again["references"] == ["pin:team-b"]
    code, resp = fleet.api("DELETE", f"/data/{cid}?force=true")
    assert code == 202
    wait_for(lambda: fleet.get(f"/data/{cid}")[0] == 404, 20, "the forced delete")
    assert not (fleet.storage("node1") / "data" / cid).exists()


def run_gc(fleet: Fleet) -> dict:
    from gswarm_web.extensions import sender

    return dict(sender().send_task(names.DATA_GC, queue=names.CONTROL_QUEUE).get(timeout=30))


def test_collector_removes_unreferenced_intermediates_only(fleet: Fleet) -> None:
    def make(kind: str, text: bytes) -> str:
        return created(
            fleet, {"data": base64.b64encode(text).decode(), "device": "node1:disk", "type": kind}
        )["chunk_id"]

    loose = make("intermediate", b"scratch " + os.urandom(16))
    pinned = make("intermediate", b"pinned " + os.urandom(16))
    held = make("intermediate", b"held " + os.urandom(16))
    kept_input = make("input", b"input " + os.urandom(16))
    fleet.post(f"/data/{pinned}/pins", {"holder": "keep"})
    doc = {
        "name": "holds-a-chunk",
        "actions": [
            {"action_id": "wait", "action_type": "noop", "node": "node1", "duration_s": 120},
            {
                "action_id": "send",
                "action_type": "data_transfer",
                "data_id": held,
                "target_device": "node2:disk",
                "dependencies": ["wait"],
            },
        ],
    }
    code, wf = fleet.post("/workflows", doc)
    assert code == 201, wf
    assert fleet.get(f"/data/{held}")[1]["references"] == [f"workflow:{wf['id']}"]
    wait_for(lambda: run_gc(fleet) and fleet.get(f"/data/{loose}")[0] == 404, 30, "the loose chunk collected")
    assert not (fleet.storage("node1") / "data" / loose).exists()
    for cid in (pinned, held, kept_input):
        assert fleet.get(f"/data/{cid}")[1]["status"] == "available"
    assert fleet.post(f"/workflows/{wf['id']}/cancel", {})[0] in (200, 202)
    wait_for(
        lambda: run_gc(fleet) and fleet.get(f"/data/{held}")[0] == 404, 30, "the held chunk collected after"
    )
    assert fleet.get(f"/data/{pinned}")[1]["status"] == "available"


def test_dram_over_capacity_evicts_copies_but_never_the_only_one(fleet: Fleet) -> None:
    size = 3_000_000

    def on_dram() -> str:
        raw = os.urandom(size)
        return created(fleet, {"data": base64.b64encode(raw).decode(), "device": "node1:dram"})["chunk_id"]

    def used() -> int:
        chunks = fleet.get("/data?device=node1:dram&per_page=200")[1]["chunks"]
        return sum(c["size"] for c in chunks)

    assert used() <= DRAM_CAPACITY, "an earlier test left node1:dram full"
    copied = on_dram()
    code, op = fleet.post(f"/data/{copied}/transfer", {"target_device": "node2:disk"})
    wait_ok(fleet, op["task_id"])
    only = [on_dram() for _ in range(2)]  # now over capacity: the copied chunk's dram copy must go
    wait_for(lambda: devices(fleet, copied) == ["node2:disk"], 30, "the dram copy evicted")
    assert not (fleet.dram("node1") / "data" / copied).exists()
    for cid in only:
        assert devices(fleet, cid) == ["node1:dram"]
    only.append(on_dram())  # over capacity with only single copies left: nothing is dropped
    assert run_gc(fleet)["evicted"] == 0
    for cid in only:
        assert devices(fleet, cid) == ["node1:dram"] and (fleet.dram("node1") / "data" / cid).exists()


def test_a_chunk_deleted_while_it_is_created_leaves_nothing(fleet: Fleet, web_root: tuple[Path, int]) -> None:
    root, port = web_root
    (root / "late.bin").write_bytes(os.urandom(10_000))
    GATE.clear()
    code, resp = fleet.post(
        "/data", {"source": f"http://127.0.0.1:{port}/gated/late.bin", "device": "node1:disk"}
    )
    assert code == 202, resp
    cid = resp["chunk_id"]
    wait_for(
        lambda: fleet.get(f"/queue/tasks/{resp['task_id']}")[1]["status"] == "running", 20, "the download"
    )
    code, deleted = fleet.api("DELETE", f"/data/{cid}")
    assert code == 202 and deleted == {"tasks": []}
    assert fleet.get(f"/data/{cid}")[1]["status"] == "deleting"
    GATE.set()
    assert fleet.wait_task(resp["task_id"])["status"] == "succeeded"
    wait_for(lambda: fleet.get(f"/data/{cid}")[0] == 404, 20, "the chunk gone")
    wait_for(lambda: not (fleet.storage("node1") / "data" / cid).exists(), 20, "its late copy removed")
