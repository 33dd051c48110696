"""Workflow benchmark: gswarm's dispatcher against raw Celery canvases on the same worker, in one run.

1. 1,000 independent `noop` steps vs a raw Celery `group` of 1,000 no-op tasks;
2. a 200-step chain vs a raw Celery `chain` of 200 no-op tasks;
3. a DAG that is not series-parallel, with skewed durations: makespan / critical path;
4. submitting (validate, persist, dispatch) a 1,000-action YAML.
gswarm times run from the POST to the moment every step is recorded `succeeded` in Postgres; raw Celery
times from apply_async to the last result. Ratios are gswarm / raw; the goals are issue 13's.

    python bench/workflow.py [--only group,chain,dag,submit] [--repeat 3] [--profile DIR [--profile-format raw]]

`--profile DIR` records py-spy on the web process (this one: the API runs in-process), the control worker and
the node worker during each gswarm case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery import chain, group  # noqa: E402

from bench.common import Profiles, Row  # noqa: E402
from gswarm_tasks import names  # noqa: E402
from gswarm_tasks.celery_app import make_celery  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.procs import wait_for  # noqa: E402

CASES = ("group", "chain", "dag", "submit")


def noop(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "node": "node1", "dependencies": list(deps), **kw}


def run_workflow(
    fleet: Fleet, actions: list[dict[str, Any]], timeout: float = 600
) -> tuple[float, dict[str, Any]]:
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


def ratio_row(name: str, ours: list[float], raw: list[float], goal: float) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(ours, raw, strict=True)]
    return {
        "case": name,
        "gswarm_s": [round(x, 3) for x in ours],
        "raw_s": [round(x, 3) for x in raw],
        "ratio": round(statistics.median(ratios), 2),
        "ratios": [round(r, 2) for r in ratios],
        "goal": goal,
        "pass": statistics.median(ratios) <= goal,
    }


def steps_span(steps: list[dict[str, Any]]) -> float:
    """Seconds from the first step's start to the last step's end, as the node recorded them."""
    first = min(datetime.fromisoformat(s["started_at"]).timestamp() for s in steps)
    last = max(datetime.fromisoformat(s["finished_at"]).timestamp() for s in steps)
    return last - first


def _row(key: str, r: dict[str, Any]) -> Row:
    """A case as one line: the median of its runs' ratios (or seconds) against its goal, with the spread."""
    if key == "submit":
        return Row(r["case"], r["seconds"], "s", "< 1", lambda v: v < 1.0)
    goal = r["goal"]
    return Row(r["case"], r["ratios"], "x", f"<= {goal}", lambda v: v <= goal)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(CASES), help="cases, comma-separated: " + ", ".join(CASES))
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each case (medians and every figure printed)"
    )
    ap.add_argument("--profile", help="directory for py-spy recordings of each gswarm case")
    ap.add_argument("--profile-format", default="flamegraph", choices=("flamegraph", "raw", "speedscope"))
    args = ap.parse_args()
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    if set(only) - set(CASES):
        ap.error(f"--only: choose from {', '.join(CASES)}")
    profiles = Profiles(args.profile, args.profile_format)
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-wf-"))
    fleet = Fleet(tmp, extra_env={"GSWARM_LOG_LEVEL": "WARNING"})
    results: dict[str, Any] = {}
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        pids = {"web": os.getpid(), "control": fleet.procs["control"].pid, "node": fleet.procs["node1"].pid}
        app = make_celery(fleet.settings)
        ping = app.signature(names.NODE_PING, queue="node1", routing_key="node1", immutable=True)

        # warm both paths once
        group(ping.clone() for _ in range(20)).apply_async().get(timeout=60)
        run_workflow(fleet, [noop(f"w{i}") for i in range(20)])

        if "group" in only:
            ours, raw = [], []
            for k in range(args.repeat):
                t0 = time.perf_counter()
                group(ping.clone() for _ in range(1000)).apply_async().get(timeout=600)
                raw.append(time.perf_counter() - t0)
                with profiles.record("workflow-group", pids):
                    ours.append(run_workflow(fleet, [noop(f"n{k}-{i}") for i in range(1000)])[0])
            results["group"] = ratio_row("1,000 independent noop steps vs raw Celery group", ours, raw, 1.15)

        if "chain" in only:
            ours, raw, spans = [], [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                chain(*[ping.clone() for _ in range(200)]).apply_async().get(timeout=600)
                raw.append(time.perf_counter() - t0)
                with profiles.record("workflow-chain", pids):
                    steps = [noop(f"c{i}", *([f"c{i - 1}"] if i else [])) for i in range(200)]
                    took, body = run_workflow(fleet, steps)
                    ours.append(took)
                spans.append(steps_span(body["steps"]))
            results["chain"] = ratio_row("200-step chain vs raw Celery chain", ours, raw, 1.15)
            # first step's start to the last one's end on the node: the rest of gswarm's time is the submit and
            # the recording of the last events
            results["chain"]["steps_span_s"] = [round(x, 3) for x in spans]

        if "dag" in only:
            # a -> c (long), a -> d, b (long) -> d, c -> e: critical path = max(a+c+e, b+d) = 0.1+2+0.1 vs 1.5+0.1
            dag = [
                noop("a", duration_s=0.1),
                noop("b", duration_s=1.5),
                noop("c", "a", duration_s=2.0),
                noop("d", "a", "b", duration_s=0.1),
                noop("e", "c", duration_s=0.1),
            ]
            critical = 0.1 + 2.0 + 0.1
            spans, makespans = [], []
            for _ in range(args.repeat):
                with profiles.record("workflow-dag", pids):
                    makespan, body = run_workflow(fleet, dag)
                makespans.append(makespan)
                spans.append(steps_span(body["steps"]))
            row = ratio_row(
                "non-series-parallel DAG makespan vs critical path", makespans, [critical] * len(spans), 1.05
            )
            row["steps_span_s"] = [round(x, 3) for x in spans]
            results["dag"] = row

        if "submit" in only:
            big = yaml.safe_dump(
                {
                    "name": "big",
                    "actions": [noop(f"b{i}", *([f"b{i - 1}"] if i % 10 else [])) for i in range(1000)],
                }
            )
            times = []
            for _ in range(max(3, args.repeat)):
                with profiles.record("workflow-submit", {"web": os.getpid()}):
                    t0 = time.perf_counter()
                    r = fleet.client.post(
                        "/api/v1/workflows",
                        data=big,
                        headers={**fleet.auth(), "Content-Type": "application/yaml"},
                    )
                    times.append(time.perf_counter() - t0)
                assert r.status_code == 201, r.json
                wid = r.json["id"]
                wait_for(lambda wid=wid: fleet.get(f"/workflows/{wid}")[1]["status"] != "running", 300, "big")
            med = statistics.median(times)
            results["submit"] = {
                "case": "submit a 1,000-action YAML (validate, one insert, dispatch)",
                "seconds": [round(x, 3) for x in times],
                "median_s": round(med, 3),
                "goal": "< 1 s",
                "pass": med < 1.0,
            }
        print(json.dumps(results, indent=2))
        for key in CASES:
            r = results.get(key)
            if r is not None:
                print(_row(key, r).line())
        for key in CASES:
            r = results.get(key)
            if r is None:
                continue
            verdict = "PASS" if r["pass"] else "MISS"
            if key == "submit":
                print(f"{verdict} {r['case']}: median {r['median_s']} s {r['seconds']} (goal {r['goal']})")
            else:
                print(
                    f"{verdict} {r['case']}: ratio {r['ratio']} {r['ratios']} (goal <= {r['goal']}),"
                    f" gswarm {r['gswarm_s']} s, baseline {r['raw_s']} s"
                )
        return 0
    finally:
        fleet.close()


if __name__ == "__main__":
    raise SystemExit(main())
