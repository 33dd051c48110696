"""Heartbeat benchmark: N simulated nodes heartbeat into the real stream; a real control worker writes Postgres.

Reports the control worker's CPU share (main process and pool, of one core) and the lag from a heartbeat
(its stream entry time) to the moment its `last_seen` is visible in the database.

    python bench/heartbeat.py [--nodes 1000] [--interval 5] [--duration 30]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_seconds  # noqa: E402
from gswarm_tasks import names  # noqa: E402
from gswarm_tasks.node.heartbeat import node_info  # noqa: E402
from gswarm_web.migrate import upgrade  # noqa: E402
from tests.harness.redis_db import claim_redis_db  # noqa: E402


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between one node's heartbeats")
    ap.add_argument(
        "--duration", type=float, default=30.0, help="measured seconds (after one warm-up interval)"
    )
    ap.add_argument("--redis", help="a Redis database's URL (default: a free database on the test Redis)")
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()

    dbname = f"gswarm_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    pg_base = args.pg.rsplit("/", 1)[0]
    db_url = f"{pg_base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{dbname}"
    claim = None
    if args.redis is None:
        claim = claim_redis_db()
        args.redis = claim.url
    r = redis.Redis.from_url(args.redis)
    r.flushdb()
    home = Path(tempfile.mkdtemp(prefix="gswarm-bench-"))
    worker = None
    try:
        upgrade(db_url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
        env.update(
            GSWARM_HOME=str(home),
            GSWARM_CONFIG="",
            GSWARM_REDIS_URL=args.redis,
            GSWARM_DATABASE_URL=db_url,
            GSWARM_LOG_LEVEL="WARNING",
        )
        log = open(home / "control.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "gswarm_web.celery_app",
                "worker",
                "-Q",
                "control",
                "-n",
                "control@%h",
                "-c",
                "1",
                "--loglevel",
                "INFO",
                "--without-mingle",
                "--without-gossip",
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while b"ready." not in (home / "control.log").read_bytes():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("control worker did not start:\n" + (home / "control.log").read_text())
            time.sleep(0.1)

        # A real node's heartbeat body, renamed per simulated node (built once: the bench measures the control side).
        template = node_info("sim", home, None, "10.0.0.1")
        bodies = [json.dumps({**template, "node": f"sim-{i:04d}", "state": "up"}) for i in range(args.nodes)]
        pg = psycopg.connect(args.pg.rsplit("/", 1)[0] + f"/{dbname}", autocommit=True)
        wproc = psutil.Process(worker.pid)

        lags: list[float] = []
        seen: dict[str, float] = {}
        sent = 0
        start = time.time()
        warm_until = start + args.interval
        end = warm_until + args.duration
        cpu0 = wall0 = None
        next_idx = 0
        tick = 0.05
        while True:
            now = time.time()
            if now >= end:
                break
            if cpu0 is None and now >= warm_until:
                cpu0, wall0 = cpu_seconds(wproc), time.monotonic()
            # Send every heartbeat that is due: node i beats at start + i*interval/N + k*interval.
            due = int((now - start) / args.interval * args.nodes)
            pipe = r.pipeline(transaction=False)
            while next_idx < due:
                body = bodies[next_idx % args.nodes]
                pipe.xadd(
                    names.HEARTBEAT_STREAM,
                    {"node": f"sim-{next_idx % args.nodes:04d}", "data": body},
                    maxlen=names.HEARTBEAT_MAXLEN,
                    approximate=True,
                )
                next_idx += 1
                sent += 1
            pipe.execute()
            # Observe: a row whose last_seen moved since the last poll was made visible at most `tick` ago.
            observed = time.time()
            for name, last_seen in pg.execute("SELECT name, extract(epoch from last_seen) FROM nodes"):
                ls = float(last_seen)
                if seen.get(name) != ls:
                    if name in seen and now >= warm_until:
                        lags.append(observed - ls)
                    seen[name] = ls
            time.sleep(max(0.0, tick - (time.time() - now)))
        cpu1, wall1 = cpu_seconds(wproc), time.monotonic()
        assert cpu0 is not None and wall0 is not None
        share = (cpu1 - cpu0) / (wall1 - wall0) * 100
        rate = args.nodes / args.interval
        result = {
            "nodes": args.nodes,
            "interval_s": args.interval,
            "heartbeats_per_s": round(rate, 1),
            "heartbeats_sent": sent,
            "measured_s": round(wall1 - wall0, 1),
            "control_worker_cpu_percent_of_one_core": round(share, 2),
            "lag_samples": len(lags),
            "lag_p50_s": round(pct(lags, 50), 3),
            "lag_p99_s": round(pct(lags, 99), 3),
            "lag_max_s": round(max(lags), 3) if lags else None,
            "goal": "cpu < 10 %, p99 lag < 2 s",
        }
        print(json.dumps(result, indent=2))
        ok = share < 10 and pct(lags, 99) < 2
        print(
            "PASS" if ok else "MISS",
            f"cpu {share:.2f}% (goal < 10%), p99 lag {pct(lags, 99):.3f} s (goal < 2 s),",
            f"median lag {statistics.median(lags) if lags else float('nan'):.3f} s",
        )
        pg.close()
        return 0
    finally:
        if worker is not None:
            try:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(worker.pid, signal.SIGKILL)
        r.flushdb()
        if claim is not None:
            claim.release()
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    raise SystemExit(main())
