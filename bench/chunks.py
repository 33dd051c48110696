"""Small-chunk benchmark: 4 KiB chunks through the data pool's API, on a real fleet behind the web server `gswarm up`
runs (gunicorn, with `gswarm up`'s command line), or (`--up`) against a whole `gswarm up` on SQLite and its embedded
Redis, the default a new user gets; `--busy N` keeps N busy loops on the cores meanwhile. In one run:

1. chunks/s *available* (verified on node1:dram and recorded) with 8 client threads posting `POST /data/batch`
   (100 chunks a request), and, for comparison, single `POST /data` from 8 threads;
2. one `POST /data` (4 KiB) at a time: p50 and p99 latency, against `GET /nodes` on the same server.
Each run reports against its own baseline: the p50 of `GET /nodes`, and a raw Redis `SET` of 4 KiB (per second,
8 threads), the floor a chunk write cannot beat; and every answer's status: a 5xx is a failure of the run.

    python bench/chunks.py [--count 10000] [--threads 8] [--batch 100] [--latency 300] [--repeat 1]
                           [--only batch,single,latency] [--up] [--busy 2] [--profile DIR [--profile-format raw]]
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import json
import logging
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Profiles, up_web_argv  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.local_up import start_up  # noqa: E402
from tests.harness.procs import Proc, wait_for  # noqa: E402

CASES = ("batch", "single", "latency")
SIZE = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_web(fleet: Fleet) -> tuple[Proc, str]:
    """The API as `gswarm up` serves it (its gunicorn command line)."""
    port = free_port()
    argv = up_web_argv(fleet.settings, fleet.env, port)
    proc = Proc("web", argv, fleet.env, fleet.tmp / "logs").start()
    fleet.procs["web"] = proc
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{url}/api/v1/health", timeout=2).status_code < 500, 60, "the web server")
    return proc, url


def bodies(count: int, tag: str) -> list[dict[str, Any]]:
    return [
        {
            "data": base64.b64encode(os.urandom(SIZE)).decode(),
            "device": "node1:dram",
            "type": "input",
            "format": tag,
        }
        for _ in range(count)
    ]


def fleet_counts(tag: str, since: datetime) -> dict[str, int]:
    """Chunks tagged `tag` made since `since`, by status, from the fleet's Postgres (an index range: the poll does
    not slow down as earlier runs fill the table)."""
    from gswarm_web.extensions import db
    from gswarm_web.tables import DataChunk

    db.session.remove()
    rows = db.session.execute(
        db.select(DataChunk.status, db.func.count())
        .where(DataChunk.created_at >= since, DataChunk.format == tag)
        .group_by(DataChunk.status)
    ).all()
    return {str(s): int(n) for s, n in rows}


def sqlite_counts(path: Path) -> Callable[[str, datetime], dict[str, int]]:
    """The same count from `gswarm up`'s SQLite file, read-only beside its writers."""

    def counts(tag: str, _since: datetime) -> dict[str, int]:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM data_chunks WHERE format = ? GROUP BY status", (tag,)
            )
            return {str(s): int(n) for s, n in rows}

    return counts


def wait_available(counts: Callable[[str, datetime], dict[str, int]], tag: str, count: int, timeout: float,
                   since: datetime) -> None:  # fmt: skip
    """Until every chunk tagged `tag` is available."""

    def done() -> bool:
        by = counts(tag, since)
        if by.get("failed"):
            raise SystemExit(f"{by['failed']} small chunks failed")
        return by.get("available", 0) == count

    wait_for(done, timeout, f"{count} small chunks to be available", interval=0.05)


class Client:
    """One requests.Session per thread, with the fleet's token."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers
        self.local = threading.local()
        self.errors: list[str] = []
        self.statuses: collections.Counter[int] = collections.Counter()

    def session(self) -> requests.Session:
        s = getattr(self.local, "s", None)
        if s is None:
            s = self.local.s = requests.Session()
        return s

    def post(self, path: str, body: Any, ok: tuple[int, ...] = (202,)) -> Any:
        r = self.session().post(self.url + path, json=body, headers=self.headers, timeout=120)
        self.statuses[r.status_code] += 1
        if r.status_code not in ok:
            self.errors.append(f"{r.status_code} {r.text[:200]}")
        return r

    def get(self, path: str) -> Any:
        return self.session().get(self.url + path, headers=self.headers, timeout=60)


def redis_set_rate(url: str, threads: int, count: int) -> float:
    """4 KiB `SET`s per second from `threads` threads, one round trip each: the floor of any chunk write."""
    pool = redis.ConnectionPool.from_url(url)
    payload = os.urandom(SIZE)

    def one(i: int) -> None:
        redis.Redis(connection_pool=pool).set(f"bench:set:{i}", payload, ex=60)

    with ThreadPoolExecutor(threads) as ex:
        t0 = time.perf_counter()
        list(ex.map(one, range(count)))
        return count / (time.perf_counter() - t0)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000, help="chunks per throughput run")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=100, help="chunks per POST /data/batch")
    ap.add_argument("--latency", type=int, default=300, help="sequential requests of the latency case")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default=",".join(CASES), help="cases, comma-separated: " + ", ".join(CASES))
    ap.add_argument("--up", action="store_true", help="against a whole `gswarm up` (SQLite, embedded Redis)")
    ap.add_argument("--busy", type=int, default=0, help="busy loops kept on the cores during the run")
    ap.add_argument("--profile", help="directory for py-spy recordings of each case")
    ap.add_argument("--profile-format", default="flamegraph", choices=("flamegraph", "raw", "speedscope"))
    args = ap.parse_args()
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    if set(only) - set(CASES):
        ap.error(f"--only: choose from {', '.join(CASES)}")
    profiles = Profiles(args.profile, args.profile_format)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-chunks-"))
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        client, pids, counts, redis_url = stack.enter_context(
            up_target(tmp) if args.up else fleet_target(tmp)
        )
        stack.enter_context(busy_loops(args.busy))
        return run_cases(args, only, profiles, client, pids, counts, redis_url, results)


@contextlib.contextmanager
def fleet_target(tmp: Path) -> Iterator[tuple[Client, dict[str, int], Any, str]]:
    """Celery workers on Postgres and the API under gunicorn with `gswarm up`'s command line."""
    fleet = Fleet(tmp, extra_env={"GSWARM_LOG_LEVEL": "WARNING"})
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        web, url = start_web(fleet)
        pids = {"gunicorn": web.pid, "control": fleet.procs["control"].pid, "node": fleet.procs["node1"].pid}
        yield Client(url + "/api/v1", fleet.auth()), pids, fleet_counts, fleet.redis_url
    finally:
        fleet.close()


@contextlib.contextmanager
def up_target(tmp: Path) -> Iterator[tuple[Client, dict[str, int], Any, str]]:
    """`gswarm up` itself, as a new user starts it: SQLite and its embedded Redis."""
    up = start_up(tmp, "node1", GSWARM_LOG_LEVEL="WARNING")
    try:
        up.wait_healthy()
        kinds = {"gunicorn": "gunicorn", "control": "gswarm_web.celery_app", "node": "-Q node1"}
        pids = {k: next(c.pid for c in up.children if w in " ".join(c.cmdline())) for k, w in kinds.items()}
        password = (up.home / "redis.password").read_text().strip()
        redis_url = f"redis://:{password}@127.0.0.1:{up.redis_port}/0"
        yield Client(up.api, up.auth), pids, sqlite_counts(up.home / "gswarm.db"), redis_url
    finally:
        up.proc.stop()


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait()


def run_cases(args: Any, only: list[str], profiles: Profiles, client: Client, pids: dict[str, int], counts: Any,
              redis_url: str, results: dict[str, Any]) -> int:  # fmt: skip
    timeout = max(300.0, args.count / 5)
    # warm every path once (imports, connections, each gunicorn worker's first requests)
    started = datetime.now(UTC) - timedelta(seconds=1)
    for b in bodies(16, "warm"):
        client.post("/data", b)
    if "batch" in only:
        client.post("/data/batch", {"chunks": bodies(16, "warm")})
    wait_available(counts, "warm", 32 if "batch" in only else 16, 60, started)
    redis_rate = redis_set_rate(redis_url, args.threads, 20_000)

    if "batch" in only:
        runs = []
        for k in range(args.repeat):
            tag = f"batch{k}"
            parts = [bodies(args.batch, tag) for _ in range(args.count // args.batch)]
            since = datetime.now(UTC) - timedelta(seconds=1)
            with profiles.record("chunks-batch", pids), ThreadPoolExecutor(args.threads) as ex:
                t0 = time.perf_counter()
                list(ex.map(lambda p: client.post("/data/batch", {"chunks": p}), parts))
                submitted = time.perf_counter() - t0
                wait_available(counts, tag, args.batch * len(parts), timeout, since)
                total = time.perf_counter() - t0
            runs.append((args.batch * len(parts) / submitted, args.batch * len(parts) / total))
        avail = [r[1] for r in runs]
        results["batch"] = {
            "case": f"4 KiB chunks, POST /data/batch ({args.batch} a request), {args.threads} client threads",
            "submitted_per_s": [round(r[0]) for r in runs],
            "available_per_s": [round(x) for x in avail],
            "median_available_per_s": round(statistics.median(avail)),
            "baseline": f"Redis SET of 4 KiB, {args.threads} threads: {round(redis_rate)}/s",
            "ratio": round(statistics.median(avail) / redis_rate, 3),
            "goal": ">= 2,000/s available",
            "pass": statistics.median(avail) >= 2000,
        }

    if "single" in only:
        runs = []
        n = min(args.count, 3000)
        for k in range(args.repeat):
            tag = f"single{k}"
            items = bodies(n, tag)
            since = datetime.now(UTC) - timedelta(seconds=1)
            with profiles.record("chunks-single", pids), ThreadPoolExecutor(args.threads) as ex:
                t0 = time.perf_counter()
                list(ex.map(lambda b: client.post("/data", b), items))
                submitted = time.perf_counter() - t0
                wait_available(counts, tag, n, timeout, since)
                total = time.perf_counter() - t0
            runs.append((n / submitted, n / total))
        results["single"] = {
            "case": f"4 KiB chunks through single POST /data, {args.threads} client threads",
            "submitted_per_s": [round(r[0]) for r in runs],
            "available_per_s": [round(r[1]) for r in runs],
            "median_available_per_s": round(statistics.median(r[1] for r in runs)),
            "goal": "(for comparison)",
            "pass": True,
        }

    if "latency" in only:
        posts, gets = [], []
        for k in range(args.repeat):
            items = bodies(args.latency, f"lat{k}")
            with profiles.record("chunks-latency", pids):
                for b in items:
                    t0 = time.perf_counter()
                    client.post("/data", b)
                    posts.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    client.get("/nodes")
                    gets.append(time.perf_counter() - t0)
        p50 = statistics.median(posts) * 1000
        results["latency"] = {
            "case": "one POST /data (4 KiB) at a time",
            "p50_ms": round(p50, 2),
            "p99_ms": round(pct(posts, 0.99) * 1000, 2),
            "baseline": "GET /nodes",
            "baseline_p50_ms": round(statistics.median(gets) * 1000, 2),
            "baseline_p99_ms": round(pct(gets, 0.99) * 1000, 2),
            "ratio": round(p50 / (statistics.median(gets) * 1000), 2),
            "goal": "p50 <= 8 ms",
            "pass": p50 <= 8.0,
        }
    server_errors = sum(n for code, n in client.statuses.items() if code >= 500)
    results["answers"] = {"by_status": dict(sorted(client.statuses.items())), "5xx": server_errors}
    if client.errors:
        raise SystemExit(f"{len(client.errors)} requests failed, first: {client.errors[0]}")
    print(json.dumps(results, indent=2))
    print(
        f"{'PASS' if not server_errors else 'MISS'} answers: {server_errors} 5xx of {sum(client.statuses.values())}"
    )
    for key in CASES:
        r = results.get(key)
        if r is None:
            continue
        verdict = "PASS" if r["pass"] else "MISS"
        if key == "latency":
            print(
                f"{verdict} {r['case']}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms (goal {r['goal']}); "
                f"baseline GET /nodes p50 {r['baseline_p50_ms']} ms, p99 {r['baseline_p99_ms']} ms, "
                f"ratio {r['ratio']}"
            )
        elif key == "batch":
            print(
                f"{verdict} {r['case']}: {r['median_available_per_s']}/s available {r['available_per_s']}"
                f" (goal {r['goal']}), submitted {r['submitted_per_s']}/s; baseline {r['baseline']},"
                f" ratio {r['ratio']}"
            )
        else:
            print(
                f"INFO {r['case']}: {r['median_available_per_s']}/s available {r['available_per_s']},"
                f" submitted {r['submitted_per_s']}/s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
