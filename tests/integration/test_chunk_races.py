"""Chunks have owners, on real workers: equal bytes posted by two callers are two chunks sharing one file; a delete,
a pin, a copy and the collector decide one at a time on the chunk's row."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import pytest

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for
from tests.harness.races import at_once, call


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(
        tmp_path_factory.mktemp("chunk-races"), extra_env={"GSWARM_DATA_INTERMEDIATE_TTL": "1"}
    ) as f:
        f.base_url = f.serve_http()  # type: ignore[attr-defined]
        yield f


def create(fleet: Fleet, raw: bytes, **kw: Any) -> dict[str, Any]:
    r = call(
        fleet, "POST", "/data", json={"data": base64.b64encode(raw).decode(), "device": "node1:dram", **kw}
    )
    assert r.status_code == 202, r.text
    task = fleet.wait_task(r.json()["task_id"])
    assert task["status"] == "succeeded", task
    return dict(r.json())


def run_gc(fleet: Fleet) -> dict[str, int]:
    from gswarm_web.extensions import sender

    return dict(sender().send_task(names.DATA_GC, queue=names.CONTROL_QUEUE).get(timeout=30))


def test_equal_bytes_from_two_callers_are_two_chunks_and_the_collector_takes_only_its_own(
    fleet: Fleet,
) -> None:
    raw = os.urandom(5000)
    scratch = create(fleet, raw, type="intermediate", metadata={"owner": "a"})
    kept = create(fleet, raw, type="input", metadata={"owner": "b"})
    assert kept["chunk_id"] != scratch["chunk_id"] and kept["deduplicated"] is True
    a, b = (fleet.get(f"/data/{c['chunk_id']}")[1] for c in (scratch, kept))
    assert (a["chunk_type"], a["metadata"]["owner"]) == ("intermediate", "a")
    assert (b["chunk_type"], b["metadata"]["owner"]) == ("input", "b")
    wait_for(
        lambda: run_gc(fleet) and fleet.get(f"/data/{scratch['chunk_id']}")[0] == 404,
        30,
        "the scratch collected",
    )
    assert fleet.get(f"/data/{kept['chunk_id']}")[1]["status"] == "available"
    assert (fleet.dram("node1") / "data" / kept["chunk_id"]).read_bytes() == raw
    r = call(fleet, "GET", f"/data/{kept['chunk_id']}/content")
    assert r.status_code == 200 and r.content == raw


def test_a_pin_racing_a_delete_never_pins_a_chunk_that_goes(fleet: Fleet) -> None:
    outcomes = set()
    for i in range(10):
        cid = create(fleet, os.urandom(1000 + i))["chunk_id"]
        pin, delete = at_once(
            lambda cid=cid: call(fleet, "POST", f"/data/{cid}/pins", json={"holder": "keeper"}),
            lambda cid=cid: call(fleet, "DELETE", f"/data/{cid}"),
        )
        outcomes.add((pin.status_code, delete.status_code))
        assert (pin.status_code, delete.status_code) in ((201, 409), (409, 202)), (pin.text, delete.text)
        if pin.status_code == 201:  # pinned first: the delete was refused and the chunk stays
            assert delete.json()["error"]["details"]["references"] == ["pin:keeper"]
            assert fleet.get(f"/data/{cid}")[1]["status"] == "available"
        else:  # deleted first: the pin was refused, and the chunk goes
            assert pin.json()["error"]["code"] == "CONFLICT"
            wait_for(lambda cid=cid: fleet.get(f"/data/{cid}")[0] == 404, 30, "the chunk deleted")
    assert outcomes


def test_identical_pins_at_once_pin_once(fleet: Fleet) -> None:
    cid = create(fleet, os.urandom(700))["chunk_id"]
    answers = at_once(
        *(lambda: call(fleet, "POST", f"/data/{cid}/pins", json={"holder": "same"}) for _ in range(4))
    )
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201], [a.text for a in answers]
    assert fleet.get(f"/data/{cid}")[1]["references"] == ["pin:same"]


def test_copies_racing_a_delete_answer_no_5xx_and_leave_no_stray_copy(fleet: Fleet) -> None:
    move = {"target_device": "node1:disk"}
    transfer = {"target_node": "node2", "target_device": "dram"}
    for i in range(6):
        cid = create(fleet, os.urandom(2000 + i))["chunk_id"]
        answers = at_once(
            lambda cid=cid: call(fleet, "POST", f"/data/{cid}/move", json=move),
            lambda cid=cid: call(fleet, "POST", f"/data/{cid}/transfer", json=transfer),
            lambda cid=cid: call(fleet, "DELETE", f"/data/{cid}"),
        )
        assert all(a.status_code < 500 for a in answers), [a.text for a in answers]
        for a in answers[:2]:
            if a.status_code == 202 and a.json().get("task_id"):
                fleet.wait_task(a.json()["task_id"])
        wait_for(lambda cid=cid: fleet.get(f"/data/{cid}")[0] == 404, 30, "the chunk deleted with every copy")
        for where in (fleet.dram("node1"), fleet.storage("node1"), fleet.dram("node2")):
            assert not (where / "data" / cid).exists()
