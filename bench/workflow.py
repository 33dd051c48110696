"""Workflow benchmark: gswarm's dispatcher against raw Celery canvases on the same worker, in one run.

1. 1,000 independent `noop` steps vs a raw Celery `group` of 1,000 no-op tasks;
2. a 200-step chain vs a raw Celery `chain` of 200 no-op tasks;
3. a DAG that is not series-parallel, with skewed durations: makespan / critical path;
4. submitting (validate, persist, dispatch) a 1,000-action YAML.
gswarm times run from the POST to the moment every step is recorded `succeeded` in Postgres; raw Celery
times from apply_async to the last result. Ratios are gswarm / raw (<= 1.3 is the goal).

    python bench/workflow.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery import chain, group  # noqa: E402

from gswarm_tasks import names  # noqa: E402
from gswarm_tasks.celery_app import make_celery  # noqa: E402
from tests.integration.fleet import Fleet  # noqa: E402
from tests.integration.procs import wait_for  # noqa: E402


def noop(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "node": "node1", "dependencies": list(deps), **kw}


def run_workflow(fleet: Fleet, actions: list[dict[str, Any]], timeout: float = 600) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    code, body = fleet.post("/workflows", {"name": "bench", "actions": actions})
    assert code == 201, body
    wf = body["id"]

    from gswarm_web.extensions import db
    from gswarm_web.tables import WorkflowRun

    def done() -> bool:
        # A cheap poll (one column), so the benchmark itself does not eat the CPU the workers need.
        db.session.remove()
        return db.session.scalar(db.select(WorkflowRun.status).where(WorkflowRun.id == wf)) != "running"

    wait_for(done, timeout, "the workflow", interval=0.02)
    elapsed = time.perf_counter() - t0
    body = fleet.get(f"/workflows/{wf}")[1]
    assert body["status"] == "succeeded", body["status"]
    return elapsed, body


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-wf-"))
    fleet = Fleet(tmp, redis_db=13, extra_env={"GSWARM_LOG_LEVEL": "WARNING"})
    results: dict[str, Any] = {}
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        app = make_celery(fleet.settings)
        ping = app.signature(names.NODE_PING, queue="node1", routing_key="node1", immutable=True)

        # warm both paths once
        group(ping.clone() for _ in range(20)).apply_async().get(timeout=60)
        run_workflow(fleet, [noop(f"w{i}") for i in range(20)])

        t0 = time.perf_counter()
        group(ping.clone() for _ in range(1000)).apply_async().get(timeout=600)
        raw_group = time.perf_counter() - t0
        ours_group, _ = run_workflow(fleet, [noop(f"n{i}") for i in range(1000)])
        results["1000 independent noops vs group"] = {
            "gswarm_s": round(ours_group, 3),
            "raw_s": round(raw_group, 3),
            "ratio": round(ours_group / raw_group, 2),
            "goal": "<= 1.3",
        }

        t0 = time.perf_counter()
        chain(*[ping.clone() for _ in range(200)]).apply_async().get(timeout=600)
        raw_chain = time.perf_counter() - t0
        ours_chain, _ = run_workflow(fleet, [noop(f"c{i}", *([f"c{i - 1}"] if i else [])) for i in range(200)])
        results["200-step chain vs chain"] = {
            "gswarm_s": round(ours_chain, 3),
            "raw_s": round(raw_chain, 3),
            "ratio": round(ours_chain / raw_chain, 2),
            "goal": "<= 1.3",
        }

        # a -> c (long), a -> d, b (long) -> d, c -> e: critical path = max(a+c+e, b+d) = 0.1+2+0.1 vs 1.5+0.1
        dag = [
            noop("a", duration_s=0.1),
            noop("b", duration_s=1.5),
            noop("c", "a", duration_s=2.0),
            noop("d", "a", "b", duration_s=0.1),
            noop("e", "c", duration_s=0.1),
        ]
        critical = 0.1 + 2.0 + 0.1
        makespan, body = run_workflow(fleet, dag)
        steps = {s["action_id"]: s for s in body["steps"]}
        from datetime import datetime

        first = min(datetime.fromisoformat(s["started_at"]).timestamp() for s in steps.values())
        last = max(datetime.fromisoformat(s["finished_at"]).timestamp() for s in steps.values())
        results["non-series-parallel DAG"] = {
            "makespan_s": round(makespan, 3),
            "steps_span_s": round(last - first, 3),
            "critical_path_s": critical,
            "ratio": round(makespan / critical, 3),
            "goal": "<= 1.1",
        }

        big = yaml.safe_dump(
            {"name": "big", "actions": [noop(f"b{i}", *([f"b{i - 1}"] if i % 10 else [])) for i in range(1000)]}
        )
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            r = fleet.client.post(
                "/api/v1/workflows", data=big, headers={**fleet.auth(), "Content-Type": "application/yaml"}
            )
            times.append(time.perf_counter() - t0)
            assert r.status_code == 201, r.json
            wid = r.json["id"]
            wait_for(lambda wid=wid: fleet.get(f"/workflows/{wid}")[1]["status"] != "running", 300, "big")
        results["submit 1,000-action YAML"] = {
            "seconds": [round(x, 3) for x in times],
            "median_s": round(sorted(times)[1], 3),
            "goal": "< 0.5 s",
        }
        print(json.dumps(results, indent=2))
        return 0
    finally:
        fleet.close()


if __name__ == "__main__":
    raise SystemExit(main())
