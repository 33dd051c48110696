"""Workflows on real workers: order, retries, failures, cancel, crash recovery, exclusive devices."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import yaml

from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("wf")) as f:
        yield f


def noop(aid: str, *deps: str, node: str = "node1", **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "node": node, "dependencies": list(deps), **kw}


def run(fleet: Fleet, actions: list[dict[str, Any]], timeout: float = 60, **top: Any) -> dict[str, Any]:
    code, body = fleet.post("/workflows", {"name": "t", "actions": actions, **top})
    assert code == 201, body
    return wait_done(fleet, body["id"], timeout)


def wait_done(fleet: Fleet, wf_id: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        code, body = fleet.get(f"/workflows/{wf_id}")
        return body if code == 200 and body["status"] != "running" else None

    return wait_for(done, timeout, f"workflow {wf_id} to finish")


def steps(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["action_id"]: s for s in body["steps"]}


def t(s: dict[str, Any], key: str) -> float:
    return datetime.fromisoformat(s[key]).timestamp()


def test_diamond_runs_in_order_with_parallel_middle(fleet: Fleet) -> None:
    body = run(
        fleet,
        [
            noop("a", duration_s=0.2),
            noop("b", "a", duration_s=1),
            noop("c", "a", node="node2", duration_s=1),
            noop("d", "b", "c"),
        ],
    )
    assert body["status"] == "succeeded", body
    s = steps(body)
    assert t(s["b"], "started_at") >= t(s["a"], "finished_at") - 0.01
    assert t(s["c"], "started_at") >= t(s["a"], "finished_at") - 0.01
    assert t(s["d"], "started_at") >= max(t(s["b"], "finished_at"), t(s["c"], "finished_at")) - 0.01
    assert t(s["c"], "started_at") < t(s["b"], "finished_at")  # b and c overlapped
    assert s["c"]["node"] == "node2"


def test_no_barrier_in_a_dag_that_is_not_series_parallel(fleet: Fleet) -> None:
    # a -> c, a -> d, b -> d: c must start as soon as a is done, while b is still running.
    body = run(
        fleet,
        [
            noop("a", duration_s=0.1),
            noop("b", node="node2", duration_s=3),
            noop("c", "a"),
            noop("d", "a", "b"),
        ],
    )
    assert body["status"] == "succeeded"
    s = steps(body)
    assert t(s["c"], "finished_at") < t(s["b"], "finished_at")
    assert t(s["d"], "started_at") >= t(s["b"], "finished_at") - 0.01


def test_references_resolve_from_earlier_outputs(fleet: Fleet) -> None:
    body = run(
        fleet,
        [
            noop("a", outputs={"x": 41, "name": "m"}),
            noop("b", "a"),
            noop("c", "b", node="node2", outputs={"y": "${a.x}", "z": "${a.name}-v2"}),
        ],
    )
    s = steps(body)
    assert s["c"]["outputs"] == {"y": 41, "z": "m-v2"}


def test_retry_then_success(fleet: Fleet) -> None:
    body = run(fleet, [noop("flaky", fail_times=2, retries=3, retry_backoff=0.1), noop("after", "flaky")])
    assert body["status"] == "succeeded", body
    s = steps(body)
    assert s["flaky"]["attempts"] == 3 and s["after"]["status"] == "succeeded"


def test_failure_skips_dependents_only(fleet: Fleet) -> None:
    body = run(
        fleet,
        [
            noop("bad", fail_times=5),
            noop("child", "bad"),
            noop("grandchild", "child"),
            noop("free", node="node2", duration_s=0.5),
            noop("free2", "free"),
        ],
    )
    assert body["status"] == "failed"
    s = steps(body)
    assert s["bad"]["status"] == "failed" and s["bad"]["error"]["code"] == "TASK_FAILED"
    assert s["child"]["status"] == "skipped" and s["grandchild"]["status"] == "skipped"
    assert s["free"]["status"] == "succeeded" and s["free2"]["status"] == "succeeded"


def test_fail_fast_cancels_the_rest(fleet: Fleet) -> None:
    body = run(fleet, [noop("bad", fail_times=5), noop("slow", node="node2", duration_s=20)], fail_fast=True)
    assert body["status"] == "cancelled"
    assert steps(body)["slow"]["status"] == "cancelled"


def test_cancel_mid_run_stops_running_and_pending_steps(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows", {"name": "c", "actions": [noop("long", duration_s=30), noop("next", "long")]}
    )
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["long"]["status"] == "running", 20, "long running"
    )
    t0 = time.monotonic()
    code, _ = fleet.post(f"/workflows/{wf}/cancel", {})
    assert code == 200
    body = fleet.get(f"/workflows/{wf}")[1]
    assert body["status"] == "cancelled"
    assert {s["status"] for s in body["steps"]} == {"cancelled"}
    # The running noop notices within a fraction of a second; nothing starts later, even after a restart.
    fleet.procs["node1"].stop()
    fleet.start_node("node1")
    events = fleet.redis_events(wf)
    assert not [
        e for e in events if e["event"] == "started" and e["task_id"] == steps(body)["next"]["task_id"]
    ]
    assert time.monotonic() - t0 < 30


def test_sigkill_of_the_whole_worker_mid_step_then_success(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows", {"name": "k", "actions": [noop("victim", duration_s=3), noop("after", "victim")]}
    )
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["victim"]["status"] == "running", 20, "victim running"
    )
    fleet.procs["node1"].kill_group(signal.SIGKILL)
    fleet.start_node("node1")
    restarted = time.monotonic()
    body = wait_done(fleet, wf, 30)
    assert body["status"] == "succeeded", body
    assert time.monotonic() - restarted < 15  # seconds after the restart, not the visibility timeout
    started = [
        e
        for e in fleet.redis_events(wf)
        if e["event"] == "started" and e["task_id"] == steps(body)["victim"]["task_id"]
    ]
    assert len(started) == 2
    assert steps(body)["victim"]["attempts"] == 2  # the run the crash cut short counts


def test_killed_pool_child_is_requeued_at_once(fleet: Fleet) -> None:
    import psutil

    code, body = fleet.post("/workflows", {"name": "p", "actions": [noop("victim", duration_s=2)]})
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["victim"]["status"] == "running", 20, "victim running"
    )
    main = psutil.Process(fleet.procs["node1"].pid)
    for child in main.children():
        child.kill()
    body = wait_done(fleet, wf, 30)
    assert body["status"] == "succeeded"
    assert fleet.procs["node1"].proc.poll() is None


def test_exclusive_devices_never_overlap_and_others_run_in_parallel(fleet: Fleet) -> None:
    body = run(
        fleet,
        [noop(f"gpu{i}", duration_s=0.6, exclusive=["node1:gpu0"]) for i in range(3)]
        + [noop(f"free{i}", duration_s=0.6) for i in range(2)],
    )
    assert body["status"] == "succeeded"
    s = steps(body)
    spans = sorted((t(s[f"gpu{i}"], "started_at"), t(s[f"gpu{i}"], "finished_at")) for i in range(3))
    for (_a0, a1), (b0, _b1) in zip(spans, spans[1:], strict=False):
        assert b0 >= a1 - 0.005, spans
    f0, f1 = (
        (t(s["free0"], "started_at"), t(s["free0"], "finished_at")),
        (t(s["free1"], "started_at"), t(s["free1"], "finished_at")),
    )
    assert f0[0] < f1[1] and f1[0] < f0[1]  # overlapped


def test_yaml_multipart_graph_queue_and_refusals(fleet: Fleet) -> None:
    text = yaml.safe_dump({"name": "y", "actions": [noop("a"), noop("b", "a")]})
    r = fleet.client.post(
        "/api/v1/workflows", data=text, headers={**fleet.auth(), "Content-Type": "application/yaml"}
    )
    assert r.status_code == 201, r.json
    wait_done(fleet, r.json["id"])
    graph = fleet.get(f"/workflows/{r.json['id']}/graph")[1]
    assert {(e["from"], e["to"]) for e in graph["edges"]} == {("a", "b")}
    assert {n["status"] for n in graph["nodes"]} == {"succeeded"}
    import io

    r = fleet.client.post(
        "/api/v1/workflows",
        data={"file": (io.BytesIO(text.encode()), "wf.yaml")},
        headers=fleet.auth(),
        content_type="multipart/form-data",
    )
    assert r.status_code == 201
    before = (fleet.get("/workflows")[1]["total"], fleet.get("/queue/tasks")[1]["total"])
    bad = [
        ({"name": "x", "actions": [noop("a", "ghost")]}, "actions[a].dependencies"),
        (
            {
                "name": "x",
                "actions": [
                    {
                        "action_id": "d",
                        "action_type": "data_create",
                        "source": "s3://b/x",
                        "target_device": "node1:dram",
                    }
                ],
            },
            "actions[d].source",  # s3:// is refused unless enabled
        ),
        ({"name": "x", "actions": [noop("a", node="nodez")]}, "actions[a].node"),
    ]
    for doc, field in bad:
        code, resp = fleet.post("/workflows", doc)
        assert code in (404, 422) and resp["error"]["message"].startswith(field), resp
    assert (fleet.get("/workflows")[1]["total"], fleet.get("/queue/tasks")[1]["total"]) == before
    q = fleet.get("/queue")[1]
    assert q["nodes"]["node1"]["normal"]["completed"] >= 2
    hist = fleet.get("/queue/history?limit=5&status=succeeded")[1]
    assert len(hist["tasks"]) == 5 and all(x["status"] == "succeeded" for x in hist["tasks"])


def test_restarting_the_control_worker_mid_run_loses_nothing(fleet: Fleet) -> None:
    actions = [
        noop(f"s{i}", *([f"s{i - 1}"] if i else []), node="node1" if i % 2 else "node2", duration_s=0.1)
        for i in range(30)
    ]
    code, body = fleet.post("/workflows", {"name": "restart", "actions": actions})
    wf = body["id"]
    wait_for(lambda: fleet.get(f"/workflows/{wf}")[1]["step_counts"].get("succeeded", 0) >= 3, 20, "progress")
    fleet.procs["control"].kill_group(signal.SIGKILL)
    time.sleep(0.5)  # steps keep running and reporting into the stream while no control worker reads it
    fleet.start("control", "control", app_module="gswarm_web.celery_app")
    body = wait_done(fleet, wf, 60)
    assert body["status"] == "succeeded"
    assert all(s["status"] == "succeeded" and s["started_at"] and s["finished_at"] for s in body["steps"])


def test_cli_runs_a_workflow_and_its_exit_code_says_how_it_went(fleet: Fleet, tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    url = fleet.serve_http()
    env = {**fleet.env, "GSWARM_API_URL": url, "GSWARM_TOKEN": fleet.token}
    gswarm = str(Path(sys.executable).with_name("gswarm"))
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(
        yaml.safe_dump({"name": "cli-good", "actions": [noop("a"), noop("b", "a", node="node2")]})
    )
    bad.write_text(yaml.safe_dump({"name": "cli-bad", "actions": [noop("a", fail_times=3), noop("b", "a")]}))
    r = subprocess.run(
        [gswarm, "workflow", "run", str(good), "--wait"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "workflow succeeded" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(
        [gswarm, "workflow", "run", str(bad), "--wait"], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "workflow failed" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(
        [gswarm, "workflow", "example", "--output", str(tmp_path / "ex")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    from gswarm_web.workflows.examples import ORDER

    assert r.returncode == 0 and len(list((tmp_path / "ex").glob("*.yaml"))) == len(ORDER)
    for f in (tmp_path / "ex").glob("*.yaml"):  # on this fleet (no GPU, no s3) validate says what submit does
        assert_validate_agrees(fleet, f.read_text())
    r = subprocess.run(
        [gswarm, "queue", "history", "--limit", "3"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "succeeded" in r.stdout


def test_a_step_over_its_time_limit_fails(fleet: Fleet) -> None:
    body = run(fleet, [noop("slow", duration_s=20, timeout_s=1), noop("after", "slow")])
    s = steps(body)
    assert (
        body["status"] == "failed" and s["slow"]["status"] == "failed" and s["after"]["status"] == "skipped"
    )
    assert "TimeLimit" in s["slow"]["error"]["message"]
    assert t(s["slow"], "finished_at") - t(s["slow"], "started_at") < 5


def test_cancelling_one_step_skips_its_dependents(fleet: Fleet) -> None:
    code, body = fleet.post(
        "/workflows",
        {
            "name": "one",
            "actions": [noop("long", duration_s=30), noop("x", "long"), noop("other", node="node2")],
        },
    )
    wf = body["id"]
    wait_for(
        lambda: steps(fleet.get(f"/workflows/{wf}")[1])["long"]["status"] == "running", 20, "long running"
    )
    tid = steps(fleet.get(f"/workflows/{wf}")[1])["long"]["task_id"]
    code, task = fleet.post(f"/queue/tasks/{tid}/cancel", {})
    assert code == 200 and task["status"] == "cancelled"
    body = wait_done(fleet, wf, 30)
    s = steps(body)
    assert (
        s["long"]["status"] == "cancelled"
        and s["x"]["status"] == "skipped"
        and s["other"]["status"] == "succeeded"
    )
    assert body["status"] == "cancelled"


def answer(fleet: Fleet, path: str, text: str) -> tuple[int, Any]:
    r = fleet.client.post(path, data=text, headers={**fleet.auth(), "Content-Type": "application/yaml"})
    return r.status_code, r.json


def assert_validate_agrees(fleet: Fleet, text: str) -> None:
    """POST /workflows/validate answers valid exactly when POST /workflows accepts, else the very same error; and
    validating creates nothing."""
    before = (
        fleet.get("/workflows")[1]["total"],
        fleet.get("/services")[1]["total"],
        fleet.get("/models")[1]["total"],
    )
    v_code, v = answer(fleet, "/api/v1/workflows/validate", text)
    after = (
        fleet.get("/workflows")[1]["total"],
        fleet.get("/services")[1]["total"],
        fleet.get("/models")[1]["total"],
    )
    assert after == before, (before, after)
    s_code, s = answer(fleet, "/api/v1/workflows", text)
    if s_code == 201:
        assert v_code == 200 and v["valid"] and v["actions"] == sum(s["step_counts"].values()), (v, s)
        assert fleet.api("POST", f"/workflows/{s['id']}/cancel")[0] in (200, 422)
    else:
        assert v_code == s_code, (text[:200], v, s)
        same = ("code", "message", "details")
        assert {k: v["error"][k] for k in same} == {k: s["error"][k] for k in same}


def test_validate_runs_every_check_submit_runs(fleet: Fleet) -> None:
    """Good and bad documents, each refused (or accepted) by validate exactly as by submit: the document, the
    fleet's nodes, the registry, sources, URLs, placement and chunks."""
    download = {"action_id": "d", "action_type": "download", "model_name": "never-registered",
                "target_device": "node1:disk"}  # fmt: skip
    docs = [
        {"name": "good", "actions": [noop("a"), noop("b", "a", node="node2")]},
        {"name": "bad-document", "actions": [noop("a", "a")]},
        {"name": "no-such-node", "actions": [noop("a", node="node9")]},
        {"name": "unregistered", "actions": [download]},
        {"name": "bad-source", "actions": [{**download, "source_url": "ftp://example.com/m"}]},
        {
            "name": "s3-off",
            "actions": [
                {
                    "action_id": "c",
                    "action_type": "data_create",
                    "source": "s3://b/k",
                    "target_device": "node1:dram",
                }
            ],
        },  # fmt: skip
        {
            "name": "no-gpu",
            "actions": [
                {**download, "source_url": "hf://org/m"},
                {
                    "action_id": "s",
                    "action_type": "serve",
                    "model_name": "never-registered",
                    "device": "auto:gpu",
                    "dependencies": ["d"],
                },
            ],
        },  # fmt: skip
        {
            "name": "no-chunk",
            "actions": [
                {
                    "action_id": "m",
                    "action_type": "data_move",
                    "data_id": "nope",
                    "target_device": "node1:disk",
                }
            ],
        },  # fmt: skip
        {
            "name": "elsewhere",
            "actions": [
                {"action_id": "h", "action_type": "health_check", "target_url": "http://10.1.2.3:8080/health"}
            ],
        },  # fmt: skip
        {
            "name": "node-port-unserved",
            "actions": [
                {"action_id": "h", "action_type": "health_check", "target_url": "http://node1:8080/health"}
            ],
        },  # fmt: skip
    ]
    for doc in docs:
        assert_validate_agrees(fleet, yaml.safe_dump(doc))
    code, body = answer(fleet, "/api/v1/workflows/validate", yaml.safe_dump(docs[-1]))
    assert code == 422 and "node1 is a node, but nothing serves on its port 8080" in body["error"]["message"]


def test_the_originals_job_paths_submit_and_follow_a_workflow(fleet: Fleet) -> None:
    """`curl -X POST .../jobs/from-yaml -F file=@workflow.yaml`, `.../jobs/JOB_ID/status`, `.../jobs` as the
    original gsmodel documents them, under /api/v1 and with a token."""
    import io

    text = yaml.safe_dump({"name": "job", "actions": [noop("a"), noop("b", "a", node="node2")]})
    r = fleet.client.post(
        "/api/v1/jobs/from-yaml",
        headers=fleet.auth(),
        data={"file": (io.BytesIO(text.encode()), "workflow.yaml")},
        content_type="multipart/form-data",
    )
    assert r.status_code == 201, r.json
    job = r.json["id"]
    done = wait_for(lambda: fleet.get(f"/jobs/{job}/status")[1]["status"] == "succeeded", 60, "the job")
    assert done and any(w["id"] == job for w in fleet.get("/jobs?per_page=100")[1]["workflows"])
    code, body = fleet.post("/jobs", {"name": "job-json", "actions": [noop("x", node="node9")]})
    assert code == 404 and body["error"]["details"]["field"] == "actions[x].node"
