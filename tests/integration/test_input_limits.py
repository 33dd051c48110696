"""No one in, nothing exhausted, on a real fleet: the SSRF data source stores nothing and reaches nothing (at
submission, and on a node handed it directly); workflow URLs are refused at submission naming the field; the alias
bomb and JSON nested 10,000 deep are refused at once; a 1,500-action chain listed in reverse order runs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.hostile import ALIAS_BOMB, SSRF, Recorder
from tests.harness.procs import wait_for


@pytest.fixture(scope="module")
def internal() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    env = {"GSWARM_DATA_ALLOWED_HOSTS": "allowed.example"}
    with running_fleet(tmp_path_factory.mktemp("limits"), extra_env=env) as f:
        yield f


def count(fleet: Fleet, path: str) -> int:
    code, body = fleet.get(path)
    assert code == 200, body
    return int(body["total"])


def test_json_nested_10000_deep_gets_400_everywhere(fleet: Fleet) -> None:
    deep = ('{"name": "deep", "x": ' + "[" * 10_000 + "]" * 10_000 + "}").encode()
    before = count(fleet, "/workflows"), count(fleet, "/data")
    for path in ("/workflows", "/workflows/validate", "/data", "/models", "/data/batch", "/services"):
        code, body = fleet.api("POST", path, data=deep, content_type="application/json")
        assert code == 400, (path, code, body)
        assert body["error"]["code"] == "INVALID_REQUEST" and body["error"]["details"]["field"] == "body", (
            body
        )
        assert "nested deeper than 64" in body["error"]["message"]
    assert (count(fleet, "/workflows"), count(fleet, "/data")) == before


def test_the_alias_bomb_is_refused_and_stores_nothing(fleet: Fleet) -> None:
    before = count(fleet, "/workflows")
    code, body = fleet.api("POST", "/workflows", data=ALIAS_BOMB, content_type="application/yaml")
    assert code == 422, body
    assert body["error"]["details"]["field"] == "document" and "anchors" in body["error"]["message"]
    assert count(fleet, "/workflows") == before


def test_the_ssrf_source_stores_nothing_and_reaches_nothing(fleet: Fleet, internal: Recorder) -> None:
    url = SSRF.format(port=internal.port)
    before = count(fleet, "/data"), count(fleet, "/workflows")
    code, body = fleet.post("/data", {"source": url, "device": "node1:dram"})
    assert code == 422, body
    assert body["error"]["details"]["field"] == "source" and "backslash" in body["error"]["message"]
    create = {"action_id": "get", "action_type": "data_create", "source": url, "target_device": "node1:dram"}
    code, body = fleet.post("/workflows", {"name": "ssrf", "actions": [create]})
    assert code == 422, body
    assert body["error"]["details"]["field"] == "actions[get].source", body
    assert (count(fleet, "/data"), count(fleet, "/workflows")) == before
    assert internal.hits == []


def test_a_node_handed_the_ssrf_url_directly_refuses_it(fleet: Fleet, internal: Recorder) -> None:
    from gswarm_web.extensions import sender

    op_id, chunk_id = str(uuid.uuid4()), str(uuid.uuid4())
    sender().send_task(
        names.DATA_CREATE,
        args=[op_id, chunk_id, "dram"],
        kwargs={"source_url": SSRF.format(port=internal.port)},
        queue="node1",
        routing_key="node1",
    )
    client = redis.Redis.from_url(fleet.redis_url)

    def failed() -> dict[str, Any] | None:
        for _eid, f in client.xrange(names.REPORTS_STREAM):
            doc = json.loads(f[b"event"])
            if doc["id"] == op_id and doc["event"] == "failed":
                return dict(doc["data"]["error"])
        return None

    error = wait_for(failed, 60, "the node to refuse the source")
    assert error["code"] == "INVALID_REQUEST" and "backslash" in error["message"], error
    assert not (fleet.dram("node1") / "data" / chunk_id).exists()
    assert internal.hits == []


def test_workflow_urls_outside_the_allowlists_are_refused_at_submission(
    fleet: Fleet, internal: Recorder
) -> None:
    here = f"http://127.0.0.1:{internal.port}"
    before = count(fleet, "/workflows")
    cases = [
        (
            {"action_id": "h", "action_type": "health_check", "target_url": f"{here}/health"},
            "actions[h].target_url",
        ),
        (
            {"action_id": "h", "action_type": "health_check", "target_url": "http://169.254.169.254/"},
            "actions[h].target_url",
        ),
        (
            {
                "action_id": "i",
                "action_type": "inference",
                "service_url": here,
                "input": "c",
                "output_device": "node1:dram",
            },
            "actions[i].service_url",
        ),
    ]
    for action, field in cases:
        code, body = fleet.post("/workflows", {"name": "out", "actions": [action]})
        assert code == 422, body
        assert body["error"]["details"]["field"] == field, body
        assert "workflows.allowed_hosts" in body["error"]["message"]
    assert count(fleet, "/workflows") == before
    assert internal.hits == []


def test_a_chain_of_1500_listed_in_reverse_order_submits_and_runs(fleet: Fleet) -> None:
    acts = [{"action_id": "a0", "action_type": "noop", "node": "node1"}]
    acts += [
        {"action_id": f"a{i}", "action_type": "noop", "node": "node1", "dependencies": [f"a{i - 1}"]}
        for i in range(1, 1500)
    ]
    acts.reverse()
    code, body = fleet.post("/workflows", {"name": "reverse", "actions": acts})
    assert code == 201, body

    def done() -> dict[str, Any] | None:
        code, run = fleet.get(f"/workflows/{body['id']}")
        return run if code == 200 and run["status"] != "running" else None

    run = wait_for(done, 600, "the reversed chain to finish")
    assert run["status"] == "succeeded" and run["step_counts"] == {"succeeded": 1500}, run["step_counts"]
