"""Placement on a fleet with GPUs (fake GPUs of known memory, announced by real node workers): `auto` never picks
a GPU without room, a model that fits nowhere is refused naming the largest free GPU and what it needs, and a
workflow that leaves its devices out is placed at submission, every step on a real device of one node's trail."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gswarm_web.workflows.examples import RUNNABLE
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

GIB = 1024**3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """node1: two 16 GiB GPUs; node2: one 4 GiB GPU (fake GPUs use 10-50% of their memory)."""
    with running_fleet(tmp_path_factory.mktemp("gpus"), nodes=()) as f:
        f.start_node("node1", GSWARM_FAKE_GPUS="2", GSWARM_FAKE_GPU_MEMORY=str(16 * GIB))
        f.start_node("node2", GSWARM_FAKE_GPUS="1", GSWARM_FAKE_GPU_MEMORY=str(4 * GIB))
        wait_for(lambda: f.get("/scheduling/fleet")[1]["gpus"] == 3, 30, "three GPUs announced")
        yield f


def _register(fleet: Fleet, name: str, size: int) -> None:
    code, body = fleet.post(
        "/models",
        {
            "model_name": name,
            "model_type": "llm",
            "model_size": size,
            "source_url": f"https://huggingface.co/org/{name}",
        },
    )
    assert code == 201, body


def test_auto_never_picks_a_gpu_without_room(fleet: Fleet) -> None:
    _register(fleet, "fits-node1", 5 * GIB)  # needs 6 GiB with the 1.2 overhead: more than node2's whole GPU
    code, plan = fleet.get("/placement?model=fits-node1&action=serve")
    assert code == 200, plan
    assert plan["chosen"] in ("node1:gpu0", "node1:gpu1")
    assert plan["need_bytes"] == int(5 * GIB * 1.2)
    node2 = [c for c in plan["candidates"] if c["device"] == "node2:gpu0"]
    assert node2 and node2[0]["lost"].startswith("needs 6.0 GiB") and not node2[0].get("chosen")

    code, plan = fleet.get("/placement?model=fits-node1&action=load&kind=gpu")
    assert code == 200 and plan["chosen"].startswith("node1:gpu"), plan


def test_a_model_that_fits_nowhere_is_refused_naming_the_largest_free_gpu(fleet: Fleet) -> None:
    _register(fleet, "too-big", 40 * GIB)
    before = fleet.get("/services")[1]["total"]
    code, body = fleet.post("/services", {"model_name": "too-big", "device": "auto"})
    assert code == 409, body
    err = body["error"]
    assert err["details"]["need_bytes"] == int(40 * GIB * 1.2)
    assert err["details"]["largest_free_device"] in ("node1:gpu0", "node1:gpu1")
    assert err["details"]["largest_free_device"] in err["message"] and "GiB" in err["message"]
    assert fleet.get("/services")[1]["total"] == before  # nothing was created


def test_a_workflow_without_devices_is_placed_along_its_model(fleet: Fleet) -> None:
    doc = yaml.safe_load(RUNNABLE["simple-deployment"])
    _register(fleet, doc["actions"][0]["model_name"], 2 * GIB)
    code, wf = fleet.post("/workflows", doc)
    assert code in (200, 201, 202), wf
    steps = {s["action_id"]: s for s in fleet.get(f"/workflows/{wf['id']}")[1]["steps"]}
    assert fleet.api("POST", f"/workflows/{wf['id']}/cancel")[0] in (200, 202)

    download = steps["download_llama"]["target_device"]
    move = steps["move_to_gpu"]
    serve = steps["serve_model"]["device"]
    node = download.split(":")[0]
    assert download.endswith(":disk")
    assert move["source_device"] == download  # the move starts where the download left the model
    assert move["target_device"].startswith(f"{node}:gpu")  # a GPU of that node
    assert serve == move["target_device"]  # served where it was loaded
    decision: dict[str, Any] = steps["move_to_gpu"]["placement"]["target_device"]
    assert decision["chosen"] == move["target_device"] and decision["candidates"]


def test_a_gpu_step_on_a_fleet_without_room_refuses_the_workflow_naming_the_field(fleet: Fleet) -> None:
    doc = yaml.safe_load(RUNNABLE["simple-deployment"])
    doc["actions"][0]["model_name"] = doc["actions"][1]["model_name"] = doc["actions"][2]["model_name"] = (
        "huge"
    )
    _register(fleet, "huge", 100 * GIB)
    before = fleet.get("/workflows")[1]["total"]
    code, body = fleet.post("/workflows", doc)
    assert code == 409, body
    assert body["error"]["details"]["field"] == "actions[move_to_gpu].target_device"
    assert "actions[move_to_gpu].target_device" in body["error"]["message"]
    assert fleet.get("/workflows")[1]["total"] == before
