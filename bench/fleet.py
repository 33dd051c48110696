"""Fleet benchmark: the control plane at 1,000 nodes x 8 GPUs (simulated nodes writing the real streams).

1. the control worker's CPU share (main process and pool, of one core) while 1,000 nodes heartbeat every 5 s and
   send 1 Hz frames of 8 GPUs (8,000 GPU samples/s); the heartbeat-to-`last_seen` lag and the age of the newest
   frame of every node in `/metrics/latest` (goal: < 25 % of one core);
2. `GET /nodes` behind gunicorn as `gswarm up` serves it, one request at a time (goal: p99 < 100 ms);
3. `GET /metrics`: Prometheus scraping 8,000 GPUs' series (goal: < 1 s);
4. the dashboard's fleet page in Chromium: from navigation to the frame that paints every node (goal: < 1 s);
5. a 10,000-step workflow (noop steps on a real node worker): submit, run to the end, `GET /workflows/{id}`.

Each figure is the median of --repeat runs with its spread; the load average is printed beside it.

    python bench/fleet.py [--nodes 1000] [--gpus 8] [--repeat 3] [--only cpu,nodes,metrics,page,workflow]
                          [--cpu-seconds 20] [--steps 10000] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.api_load import Gunicorn, wrk  # noqa: E402
from bench.common import Profiles, Row, cpu_seconds, up_web_argv  # noqa: E402
from gswarm_tasks import names  # noqa: E402
from gswarm_web.cli.up import free_port  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.procs import wait_for  # noqa: E402

CASES = ("cpu", "nodes", "metrics", "page", "workflow")
CHROMIUM = "/usr/bin/chromium"
# what the fleet page records (fleet.js): navigation to first paint, view start to paint, the first draw alone
PAGE_TIMES = {"first_paint_ms": "firstPaintMs", "render_ms": "renderMs", "draw_ms": "firstDrawMs"}


def control_window(fleet: Fleet, seconds: float) -> dict[str, float]:
    """The control worker's CPU share over `seconds`, the heartbeat lag and the newest frames' age meanwhile."""
    from gswarm_web.extensions import db

    proc = psutil.Process(fleet.procs["control"].pid)
    r = redis.Redis.from_url(fleet.redis_url)
    seen: dict[str, float] = {}
    lags: list[float] = []
    ages: list[float] = []
    c0, t0 = cpu_seconds(proc), time.monotonic()
    next_ages = 0.0
    while time.monotonic() - t0 < seconds:
        db.session.remove()
        observed = time.time()
        for name, last in db.session.execute(
            db.text("SELECT name, extract(epoch from last_seen) FROM nodes")
        ):
            if seen.get(name) not in (None, float(last)):
                lags.append(observed - float(last))
            seen[name] = float(last)
        if time.monotonic() >= next_ages:
            now = time.time()
            raw: Any = r.hgetall(names.METRICS_LATEST_KEY)
            ages += [now - json.loads(v)["time"] for v in raw.values()]
            next_ages = time.monotonic() + 2.0
        time.sleep(0.5)
    share = (cpu_seconds(proc) - c0) / (time.monotonic() - t0) * 100
    lags.sort()
    ages.sort()
    return {
        "cpu_percent": round(share, 1),
        "heartbeat_lag_p99_s": round(lags[int(0.99 * (len(lags) - 1))], 3) if lags else float("nan"),
        "frame_age_p99_s": round(ages[int(0.99 * (len(ages) - 1))], 3) if ages else float("nan"),
    }


def scrape(base: str, token: str, times: int = 3) -> list[float]:
    """Seconds per `GET /metrics`, each read to its end; each past the web's frame interval after the one before, so
    that every scrape builds its body from new frames (none is answered from the cache of another)."""
    from gswarm_web.control.sessions.prometheus import FRAME_INTERVAL_S

    out = []
    for _ in range(times):
        time.sleep(FRAME_INTERVAL_S + 0.2)
        t0 = time.perf_counter()
        resp = requests.get(
            f"{base}/api/v1/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        resp.raise_for_status()
        assert "DCGM_FI_DEV_GPU_UTIL" in resp.text
        out.append(time.perf_counter() - t0)
    return out


def timed_wrk(api: psutil.Process, url: str, token: str, seconds: int = 10) -> dict[str, float]:
    """wrk with one connection for `seconds`: its latencies and the web's CPU milliseconds per request."""
    c0 = cpu_seconds(api)
    res = wrk(url, token, 1, seconds)
    return {**res, "cpu_ms": (cpu_seconds(api) - c0) * 1000 / max(res["requests"], 1)}


def fleet_page(base: str, token: str, runs: int, nodes: int) -> list[dict[str, float]]:
    """Each run: a fresh browser context signed in, navigation to `/#/fleet`, until every node's card is drawn."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            for _ in range(runs):
                ctx = browser.new_context(viewport={"width": 1400, "height": 900})
                ctx.add_init_script(f"sessionStorage.setItem('gswarm.token', {json.dumps(token)})")
                page = ctx.new_page()
                page.goto(f"{base}/#/fleet")
                page.wait_for_function(
                    "() => document.querySelector('#page-fleet')?.dataset.firstPaintMs", timeout=60_000
                )
                data = page.evaluate("() => ({...document.querySelector('#page-fleet').dataset})")
                cards = page.evaluate("() => document.querySelectorAll('#nodes section.node').length")
                assert cards >= nodes, f"{cards} node cards drawn of {nodes}"
                out.append({k: float(data[v]) for k, v in PAGE_TIMES.items()})
                ctx.close()
        finally:
            browser.close()
    return out


def workflow_run(fleet: Fleet, base: str, steps: int) -> dict[str, float]:
    """A `steps`-action workflow (chains of 10 noop steps on node1): submit, run to the end, read it back."""
    actions = [
        {
            "action_id": f"s{i}",
            "action_type": "noop",
            "node": "node1",
            "dependencies": [f"s{i - 1}"] if i % 10 else [],
        }
        for i in range(steps)
    ]
    headers = {"Authorization": f"Bearer {fleet.token}"}
    t0 = time.perf_counter()
    resp = requests.post(
        f"{base}/api/v1/workflows", json={"name": "fleet-bench", "actions": actions}, headers=headers
    )
    submit = time.perf_counter() - t0
    assert resp.status_code == 201, resp.text[:500]
    wf = resp.json()["id"]
    from gswarm_web.extensions import db
    from gswarm_web.tables import WorkflowRun

    def done() -> bool:
        db.session.remove()
        return db.session.scalar(db.select(WorkflowRun.status).where(WorkflowRun.id == wf)) != "running"

    wait_for(done, 1800, "the workflow", interval=0.25)
    ran = time.perf_counter() - t0
    t1 = time.perf_counter()
    got = requests.get(f"{base}/api/v1/workflows/{wf}", headers=headers, timeout=60)
    read = time.perf_counter() - t1
    assert got.json()["status"] == "succeeded" and len(got.json()["steps"]) == steps
    return {"submit_s": submit, "run_s": ran, "get_s": read}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--cpu-seconds", type=float, default=20.0, help="length of one CPU window")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--profile", help="directory for py-spy recordings (control worker, web)")
    args = ap.parse_args()
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    if set(only) - set(CASES):
        ap.error(f"--only: choose from {', '.join(CASES)}")
    profiles = Profiles(args.profile, "raw")
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-fleet-"))
    env = {"GSWARM_LOG_LEVEL": "WARNING", "GSWARM_HEARTBEAT_INTERVAL": "5", "GSWARM_HEARTBEAT_TIMEOUT": "30"}
    fleet = Fleet(tmp, extra_env=env)
    rows: list[Row] = []
    sim = server = None
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        sim = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "fleet_sim.py"),
                fleet.redis_url,
                "--nodes",
                str(args.nodes),
            ]
            + ["--gpus", str(args.gpus)],
            cwd=ROOT,
        )
        want = args.nodes
        wait_for(
            lambda: fleet.get("/nodes?per_page=1")[1]["total"] >= want, 120, f"{want} nodes recorded", 1.0
        )
        wait_for(
            lambda: redis.Redis.from_url(fleet.redis_url).hlen(names.METRICS_LATEST_KEY) >= want,
            120,
            "frames",
            1.0,
        )
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = Gunicorn(up_web_argv(fleet.settings, fleet.env, port), fleet.env, tmp / "web.log", base)
        pids = {"control": fleet.procs["control"].pid, "api": server.proc.pid}  # gunicorn: its workers too
        if "cpu" in only:
            time.sleep(5)  # past the first round of heartbeats (every node new)
            with profiles.record("fleet-control", {"control": pids["control"]}):
                runs = [control_window(fleet, args.cpu_seconds) for _ in range(args.repeat)]
            rows.append(Row("control worker CPU, heartbeats + 1 Hz frames", [r["cpu_percent"] for r in runs],
                            "% of one core", "< 25", lambda v: v < 25))  # fmt: skip
            rows.append(Row("heartbeat -> last_seen lag p99", [r["heartbeat_lag_p99_s"] for r in runs], "s", "< 2",
                            lambda v: v < 2))  # fmt: skip
            rows.append(Row("newest frame age p99 (/metrics/latest)", [r["frame_age_p99_s"] for r in runs], "s",
                            "< 2.5", lambda v: v < 2.5))  # fmt: skip
        if "nodes" in only:
            url = f"{base}/api/v1/nodes"
            wrk(url, fleet.token, 1, 1)
            api = psutil.Process(pids["api"])
            with profiles.record("fleet-nodes", {"api": pids["api"]}):
                runs = [timed_wrk(api, url, fleet.token) for _ in range(args.repeat)]
            rows.append(Row(f"GET /nodes p99, {args.nodes} nodes, one client", [r["p99_ms"] for r in runs], "ms",
                            "< 100", lambda v: v < 100))  # fmt: skip
            rows.append(Row("GET /nodes p50", [r["p50_ms"] for r in runs], "ms", "info", None))
            rows.append(
                Row("GET /nodes web CPU per request", [r["cpu_ms"] for r in runs], "ms", "info", None)
            )
            floor = [timed_wrk(api, f"{base}/api/v1/tokens/self", fleet.token) for _ in range(args.repeat)]
            rows.append(Row("floor: GET /tokens/self p99 (auth, one row), same run", [r["p99_ms"] for r in floor],
                            "ms", "info", None))  # fmt: skip
            runs = [wrk(f"{url}?per_page=500", fleet.token, 1, 5) for _ in range(args.repeat)]
            rows.append(Row("GET /nodes?per_page=500 p99 (the dashboard's pages)", [r["p99_ms"] for r in runs], "ms",
                            "info", None))  # fmt: skip
        if "metrics" in only:
            scrape(base, fleet.token, 1)
            with profiles.record("fleet-metrics", {"api": pids["api"]}):
                runs_s = [statistics.median(scrape(base, fleet.token)) for _ in range(args.repeat)]
            rows.append(Row(f"GET /metrics, {args.nodes * args.gpus} GPUs", [x * 1000 for x in runs_s], "ms",
                            "< 1000", lambda v: v < 1000))  # fmt: skip
        if "page" in only:
            fleet_page(base, fleet.token, 1, args.nodes)  # warm: the static files and the server's caches
            with profiles.record("fleet-page", {"api": pids["api"]}):
                runs_p = fleet_page(base, fleet.token, args.repeat, args.nodes)
            rows.append(Row("fleet page: navigation to first paint", [r["first_paint_ms"] for r in runs_p], "ms",
                            "< 1000", lambda v: v < 1000))  # fmt: skip
            rows.append(
                Row("fleet page: view start to paint", [r["render_ms"] for r in runs_p], "ms", "info", None)
            )
            rows.append(
                Row("fleet page: of which the first draw", [r["draw_ms"] for r in runs_p], "ms", "info", None)
            )
        if "workflow" in only:
            fleet.start_node("node1")
            runs_w = [workflow_run(fleet, base, args.steps) for _ in range(args.repeat)]
            rows.append(Row(f"{args.steps}-step workflow: submit", [r["submit_s"] for r in runs_w], "s", "< 5",
                            lambda v: v < 5))  # fmt: skip
            rows.append(Row(f"{args.steps}-step workflow: submit to succeeded", [r["run_s"] for r in runs_w], "s",
                            "info", None))  # fmt: skip
            rows.append(Row(f"GET /workflows/{{id}}, {args.steps} steps", [r["get_s"] * 1000 for r in runs_w], "ms",
                            "< 2000", lambda v: v < 2000))  # fmt: skip
    finally:
        if server is not None:
            server.stop()
        if sim is not None:
            sim.terminate()
            sim.wait(timeout=10)
        fleet.close()
    print(f"fleet: {args.nodes} simulated nodes x {args.gpus} GPUs, heartbeats every 5 s, frames at 1 Hz")
    for row in rows:
        print(row.line())
    return 0 if all(r.ok() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
