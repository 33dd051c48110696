"""API under load: `wrk` against the read endpoints behind each gunicorn setup, on a fleet of 200 nodes.

The fleet: a real control worker and node worker (Postgres, a free Redis database), 200 simulated nodes heartbeating
into the real stream every 5 s for the whole run (the control worker records them), and a recorded 1,000-step
workflow (noop steps, run to the end on node1). Each setup serves the API with gunicorn from its own command
line: `gswarm up`'s (taken from `gswarm_web.cli.up`), docker-compose.yml's `web` command, and alternatives
(worker class, processes x threads). For each: requests/s and latency percentiles from `wrk --latency` for

- `GET /api/v1/nodes` (the default page of 20),
- `GET /api/v1/nodes?per_page=200` (the whole fleet),
- `GET /api/v1/workflows/{id}` (the workflow with its 1,000 steps),

and the latency of `GET /api/v1/health` while `--idle` sockets (64) sit open doing nothing, half of them having
sent a request whose headers never end (a slow client holds whatever the server gives a connection).

Every request carries the admin bearer token; any non-2xx answer or socket error fails the run.

    python bench/api_load.py [--setups up,compose,gthread-4x2,gevent-2,sync-4] [--connections 16] [--duration 5]
                             [--repeat 3] [--idle 64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import up_web_argv  # noqa: E402
from gswarm_tasks import names  # noqa: E402
from gswarm_tasks.node.heartbeat import node_info  # noqa: E402
from gswarm_web.cli.up import free_port  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.procs import wait_for  # noqa: E402

SIM_NODES = 200
SIM_INTERVAL_S = 5.0
STEPS = 1000


# ---- the gunicorn command lines -------------------------------------------------------------------------------


def up_argv(fleet: Fleet, port: int) -> list[str]:
    """`gswarm up`'s web command, as `gswarm up` builds it."""
    return up_web_argv(fleet.settings, fleet.env, port)


def compose_argv(port: int) -> list[str]:
    """docker-compose.yml's web command, bound to this host's loopback."""
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cmd = [str(a) for a in doc["services"]["web"]["command"]]
    assert cmd[0] == "gunicorn", cmd
    i = cmd.index("--bind")
    cmd[i + 1] = f"127.0.0.1:{port}"
    return [sys.executable, "-m", *cmd]


def with_options(argv: list[str], **opts: str) -> list[str]:
    """`argv` with some gunicorn options set (`worker_class="sync"` sets `--worker-class sync`)."""
    out = list(argv)
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out[-1:-1] = [flag, value]  # before the app
    return out


def setup_argv(name: str, fleet: Fleet, port: int) -> list[str]:
    if name == "up":
        return up_argv(fleet, port)
    if name == "compose":
        return compose_argv(port)
    m = re.fullmatch(r"(gthread|gevent|sync)-(\d+)(?:x(\d+))?", name)
    if not m:
        raise SystemExit(f"unknown setup {name!r}: up, compose, gthread-PxT, gevent-P or sync-P")
    kind, procs, threads = m.group(1), m.group(2), m.group(3) or "1"
    opts = {"worker_class": kind, "workers": procs, "threads": threads}
    if kind == "gevent":
        opts["worker_connections"] = "1000"
    return with_options(up_argv(fleet, port), **opts)


class Gunicorn:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path, base: str) -> None:
        self.log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.base = base

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise SystemExit(f"gunicorn exited: {' '.join(argv)}\n{log.read_text()[-2000:]}")
            try:
                return requests.get(f"{base}/api/v1/health", timeout=1).status_code in (200, 503)
            except requests.RequestException:
                return False

        wait_for(ready, 60, "gunicorn", interval=0.2)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


# ---- wrk ------------------------------------------------------------------------------------------------------

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    assert m, text
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> dict[str, Any]:
    """requests/s, latency percentiles (ms), request count and errors from `wrk --latency`'s output."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if not rps or not total:
        raise SystemExit("cannot read wrk's output:\n" + out)
    pct = {f"p{p}_ms": round(_ms(v), 2) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.M)}
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "requests_per_s": float(rps.group(1)),
        **pct,
        "requests": int(total.group(1)),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(map(int, sock.groups())) if sock else 0,
    }


def wrk(url: str, token: str, connections: int, duration: int) -> dict[str, Any]:
    argv = [
        "wrk",
        "-t1",  # one client thread: the server has the rest of this small host
        f"-c{connections}",
        f"-d{duration}s",  # whole seconds: wrk reads no fractions
        "--latency",
        "--timeout",
        "10s",
        "-H",
        f"Authorization: Bearer {token}",
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    res = parse_wrk(done.stdout)
    if res["non_2xx"] or res["socket_errors"]:
        raise SystemExit(f"wrk saw errors against {url}:\n{done.stdout}")
    return res


def idle_health(
    base: str, port: int, idle: int, requests_n: int = 5, timeout_s: float = 5.0
) -> dict[str, Any]:
    """Seconds GET /api/v1/health takes while `idle` sockets are open (half with a request that never ends);
    a request that gets no answer within `timeout_s` counts as `timeout_s`."""
    socks = []
    for i in range(idle):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            s.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    took = []
    try:
        for _ in range(requests_n):
            t0 = time.perf_counter()
            try:
                requests.get(f"{base}/api/v1/health", timeout=timeout_s)
                took.append(time.perf_counter() - t0)
            except requests.RequestException:
                took.append(timeout_s)
    finally:
        for s in socks:
            s.close()
    return {"p50_s": round(statistics.median(took), 3), "max_s": round(max(took), 3)}


# ---- the fleet ------------------------------------------------------------------------------------------------


class Heartbeats:
    """SIM_NODES simulated nodes heartbeating into the real stream every SIM_INTERVAL_S, spread evenly."""

    def __init__(self, fleet: Fleet) -> None:
        self.client = redis.Redis.from_url(fleet.redis_url)
        template = node_info("sim", fleet.home, None, "10.0.0.1")
        self.bodies = [
            (
                {
                    "node": f"sim-{i:04d}",
                    "data": json.dumps({**template, "node": f"sim-{i:04d}", "state": "up"}),
                }
            )
            for i in range(SIM_NODES)
        ]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def beat(self, which: range) -> None:
        pipe = self.client.pipeline(transaction=False)
        for i in which:
            pipe.xadd(names.HEARTBEAT_STREAM, self.bodies[i], maxlen=names.HEARTBEAT_MAXLEN, approximate=True)
        pipe.execute()

    def _run(self) -> None:
        tick = SIM_INTERVAL_S / SIM_NODES * 10  # ten nodes at a time
        i = 0
        while not self.stopping.wait(tick):
            self.beat(range(i, min(i + 10, SIM_NODES)))
            i = (i + 10) % SIM_NODES

    def start(self) -> Heartbeats:
        self.beat(range(SIM_NODES))
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


def record_workflow(fleet: Fleet) -> str:
    actions = [{"action_id": f"s{i}", "action_type": "noop", "node": "node1"} for i in range(STEPS)]
    code, body = fleet.post("/workflows", {"name": "bench-api-load", "actions": actions})
    assert code == 201, body
    wf = str(body["id"])
    wait_for(
        lambda: fleet.get(f"/workflows/{wf}")[1]["status"] != "running", 600, "the workflow", interval=0.5
    )
    got = fleet.get(f"/workflows/{wf}")[1]
    assert got["status"] == "succeeded" and len(got["steps"]) == STEPS, got["status"]
    return wf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setups", default="up,compose,gthread-4x2,gevent-2,sync-4", help="comma-separated")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--duration", type=int, default=5, help="seconds of each wrk run (after a 1 s warm-up)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="rounds over every setup (medians and spread printed)"
    )
    ap.add_argument("--idle", type=int, default=64, help="idle sockets open while /health is timed (0: skip)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-api-"))
    fleet = Fleet(tmp, extra_env={"GSWARM_LOG_LEVEL": "WARNING"})
    beats: Heartbeats | None = None
    results: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in setups}
    idle_label = f"GET /health, {args.idle} idle sockets"
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        beats = Heartbeats(fleet).start()
        wf = record_workflow(fleet)
        wait_for(lambda: fleet.get("/nodes")[1]["total"] >= SIM_NODES + 1, 60, f"{SIM_NODES} nodes recorded")
        paths = {
            "GET /nodes": "/api/v1/nodes",
            "GET /nodes?per_page=200": "/api/v1/nodes?per_page=200",
            f"GET /workflows/{{id}} ({STEPS} steps)": f"/api/v1/workflows/{wf}",
        }
        for _ in range(args.repeat):
            for name in setups:
                port = free_port()
                base = f"http://127.0.0.1:{port}"
                server = Gunicorn(setup_argv(name, fleet, port), fleet.env, tmp / f"web-{name}.log", base)
                try:
                    for label, path in paths.items():
                        wrk(base + path, fleet.token, args.connections, 1)  # warm every worker and connection
                        results[name].setdefault(label, []).append(
                            wrk(base + path, fleet.token, args.connections, args.duration)
                        )
                    if args.idle:
                        results[name].setdefault(idle_label, []).append(idle_health(base, port, args.idle))
                finally:
                    server.stop()
    finally:
        if beats is not None:
            beats.stop()
        fleet.close()
        shutil.rmtree(tmp, ignore_errors=True)

    print(json.dumps(results, indent=2))
    print(f"wrk: 1 thread, {args.connections} connections, {args.duration:g} s per run, {args.repeat} rounds")
    for label in paths:
        for name in setups:
            runs = results[name][label]
            rps = [r["requests_per_s"] for r in runs]
            p99 = [r["p99_ms"] for r in runs]
            print(
                f"INFO {label:34s} {name:12s} {statistics.median(rps):8.1f} req/s [{min(rps):.0f}-{max(rps):.0f}]"
                f"  p99 {statistics.median(p99):7.1f} ms [{min(p99):.1f}-{max(p99):.1f}]"
            )
    for name in setups if args.idle else []:
        runs = results[name][idle_label]
        p50 = statistics.median(r["p50_s"] for r in runs)
        worst = max(r["max_s"] for r in runs)
        print(f"INFO {idle_label:34s} {name:12s} p50 {p50:6.3f} s  max {worst:6.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
