"""Model copies under concurrency, on real workers: two copies to one target at once give one 409 (or two complete
copies), never a ready copy that differs from the source; a delete takes only the copy it names; workflows take
the same turns. On Postgres and on SQLite (what `gswarm up` runs on)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for
from tests.harness.races import at_once, call

FILES = 300


@pytest.fixture(scope="module")
def model_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model of 300 files (the shape that once lost 287 of them), with one larger file among them."""
    root = tmp_path_factory.mktemp("models") / "many"
    root.mkdir()
    for i in range(FILES):
        sub = root / f"part{i // 50}"
        sub.mkdir(exist_ok=True)
        (sub / f"w{i:03d}.bin").write_bytes(os.urandom(4096 + i))
    (root / "big.bin").write_bytes(os.urandom(3 << 20))
    return root


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_src: Path
) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp(f"races-{request.param}")
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(model_src.parent)}
    if request.param == "sqlite":
        env["GSWARM_DATABASE_URL"] = f"sqlite:///{tmp / 'gswarm.db'}"
    with running_fleet(tmp, extra_env=env) as f:
        f.base_url = f.serve_http()  # type: ignore[attr-defined]
        f.register_and_download("many", f"file://{model_src}")
        yield f


def digest_tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".gswarm")
    }


def location_gone(fleet: Fleet, device: str) -> None:
    wait_for(lambda: device not in fleet.get("/models/many")[1]["locations"], 30, f"{device} removed")


def test_two_copies_to_one_target_never_leave_a_partial_ready_copy(fleet: Fleet, model_src: Path) -> None:
    source = digest_tree(model_src)
    assert len(source) == FILES + 1
    body = {"source_device": "node1:disk", "target_device": "node2:disk"}
    refused = 0
    for _round in range(16 if "postgres" in str(fleet.tmp) else 8):
        if "node2:disk" in fleet.get("/models/many")[1]["locations"]:
            r = call(fleet, "DELETE", "/models/many/locations/node2:disk")
            assert r.status_code == 202, r.text
            fleet.wait_task(r.json()["task_id"])
            location_gone(fleet, "node2:disk")
        answers = at_once(*(lambda: call(fleet, "POST", "/models/many/copy", json=body) for _ in range(2)))
        codes = sorted(a.status_code for a in answers)
        assert codes in ([202, 202], [202, 409]), [a.text for a in answers]
        for a in answers:
            if a.status_code == 409:
                refused += 1
                err = a.json()["error"]
                assert err["code"] == "CONFLICT" and err["details"]["task_id"] in err["message"]
            else:
                task = fleet.wait_task(a.json()["task_id"], 60)
                assert task["status"] == "succeeded", task
        model = fleet.get("/models/many")[1]
        assert set(model["locations"]) == {"node1:disk", "node2:disk"}
        assert digest_tree(fleet.storage("node2") / "models" / "many") == source
        assert digest_tree(fleet.storage("node1") / "models" / "many") == source
        assert not any((fleet.storage("node2") / ".staging").glob("*"))
    assert refused >= 1  # the API's check and insert are one step: a second copy at once is refused


def test_a_delete_while_copying_is_refused_and_a_copy_never_lands_on_a_deleted_target(fleet: Fleet) -> None:
    body = {"source_device": "node1:disk", "target_device": "node1:dram"}
    r = call(fleet, "POST", "/models/many/copy", json=body)
    assert r.status_code in (202, 409), r.text
    if r.status_code == 202 and r.json()["status"] != "succeeded":
        d = call(fleet, "DELETE", "/models/many/locations/node1:dram")
        assert d.status_code in (409, 422), d.text  # busy, or not there yet: nothing is sent either way
        fleet.wait_task(r.json()["task_id"])
    wait_for(lambda: "node1:dram" in fleet.get("/models/many")[1]["locations"], 30, "the dram copy recorded")
    d = call(fleet, "DELETE", "/models/many?device=node1:dram")
    assert d.status_code == 202 and [t["target_device"] or t["source_device"] for t in d.json()] == [
        "node1:dram"
    ]
    fleet.wait_task(d.json()[0]["task_id"])
    location_gone(fleet, "node1:dram")
    model = fleet.get("/models/many")[1]
    assert "node1:disk" in model["locations"] and model["status"] == "ready"  # only that copy went
    assert not (fleet.dram("node1") / "models" / "many").exists()


def test_unknown_query_parameters_change_nothing(fleet: Fleet) -> None:
    before = fleet.get("/models/many")[1]["locations"]
    r = call(fleet, "DELETE", "/models/many?devcie=node1:disk")
    assert r.status_code == 422 and r.json()["error"]["details"]["field"] == "devcie", r.text
    r = call(fleet, "DELETE", "/models/many/locations/node1:disk?force=true")
    assert r.status_code == 422 and "force" in r.json()["error"]["message"], r.text
    r = call(fleet, "POST", "/models/many/copy", json={"target_device": "node2:dram", "verify": False})
    assert r.status_code == 422 and "verify" in r.json()["error"]["details"]["fields"], r.text
    assert fleet.get("/models/many")[1]["locations"] == before
    assert fleet.get("/queue/tasks?status=running")[1]["total"] == 0


def test_two_copy_actions_of_one_workflow_to_one_target_take_turns(fleet: Fleet, model_src: Path) -> None:
    if "node2:dram" in fleet.get("/models/many")[1]["locations"]:
        fleet.wait_task(call(fleet, "DELETE", "/models/many/locations/node2:dram").json()["task_id"])
        location_gone(fleet, "node2:dram")
    copy = {
        "action_type": "copy",
        "model_name": "many",
        "source_device": "node1:disk",
        "target_device": "node2:dram",
    }
    doc = {"name": "twice", "actions": [{"action_id": "a", **copy}, {"action_id": "b", **copy}]}
    code, wf = fleet.post("/workflows", doc)
    assert code == 201, wf

    def finished() -> Any:
        body = fleet.get(f"/workflows/{wf['id']}")[1]
        return body if body["status"] != "running" else None

    body = wait_for(finished, 90, "the workflow to finish")
    assert body["status"] == "succeeded", body
    assert digest_tree(fleet.dram("node2") / "models" / "many") == digest_tree(model_src)
    assert "node2:dram" in fleet.get("/models/many")[1]["locations"]


def test_no_transfer_token_travels_in_a_task_message(fleet: Fleet) -> None:
    """A copy's message (what the broker keeps and Flower shows) names the peer and the prefix, never a token: the
    destination signs its own, for that model only, when it starts."""
    import json

    from gswarm_web.extensions import db
    from gswarm_web.tables import TaskRecord

    body = {"source_device": "node1:disk", "target_device": "node2:disk"}
    if "node2:disk" in fleet.get("/models/many")[1]["locations"]:
        fleet.wait_task(call(fleet, "DELETE", "/models/many/locations/node2:disk").json()["task_id"])
        location_gone(fleet, "node2:disk")
    r = call(fleet, "POST", "/models/many/copy", json=body)
    assert r.status_code == 202, r.text
    assert fleet.wait_task(r.json()["task_id"])["status"] == "succeeded"
    db.session.remove()
    rec = db.session.get(TaskRecord, r.json()["task_id"])
    assert rec is not None and rec.message is not None
    source = rec.message["kwargs"]["source"]
    assert source["node"] == "node1" and source["prefix"] == "disk/models/many" and "token" not in source
    assert "token" not in json.dumps(rec.message) and "token" not in json.dumps(rec.params)
