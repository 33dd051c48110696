"""Profiler benchmark: aggregation throughput through the real streams and consumer group, latency from a
sample to /metrics/latest at 1 Hz, the sampler's CPU cost at 1 Hz (8 fake GPUs, and 8 GPUs through the real
NVML path: nvml.py -> nvitop -> the mock libnvidia-ml.so.1 of the tests, with and without PCIe bandwidth and
NVLink), and the time to replay 10,000 spilled frames into Redis against a raw pipelined XADD of the same frames.

    python bench/profiler.py [--nodes 50] [--frames 400] [--spilled 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_seconds  # noqa: E402
from gswarm_tasks.names import CONTROL_GROUP, METRICS_LATEST_KEY, frames_stream  # noqa: E402
from gswarm_tasks.profiling.nvml import FakeGpuSource  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.procs import wait_for  # noqa: E402

SAMPLER_PROBE = """
import sys, time, psutil, redis
from gswarm_tasks.profiling.nvml import FakeGpuSource, default_source
from gswarm_tasks.profiling.sampler import Sampler
source = FakeGpuSource(8) if sys.argv[3] == "fake" else default_source()
assert len(source.gpus()) == 8, source.gpus()
bw, nv = sys.argv[4] == "1", sys.argv[5] == "1"
s = Sampler(redis.Redis.from_url(sys.argv[1]), "probe", 1.0, source=source, bandwidth=bw, nvlink=nv)
s.start()
p = psutil.Process()
time.sleep(2)
c0, t0 = p.cpu_times(), time.monotonic()
time.sleep(float(sys.argv[2]))
c1, t1 = p.cpu_times(), time.monotonic()
s.stop()
print((c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100)
"""


def sampler_costs(redis_url: str, tmp: Path, seconds: float) -> dict[str, object]:
    from tests.harness.nvml_mock import build_library, device, library_env, write_config

    lib = build_library(tmp / "nvml-mock")
    config = tmp / "nvml.json"
    links = [{"active": True, "rx_kib_per_s": 20_000_000, "tx_kib_per_s": 20_000_000}] * 18
    write_config(config, {"devices": [device(i, utilization_gpu_percent=40, nvlink=links) for i in range(8)]})
    base = {**os.environ, "PYTHONPATH": str(ROOT), "GSWARM_LOG_LEVEL": "WARNING"}
    cases = {
        "fake_gpus": ("fake", "1", "0", base),
        "nvml_mock": ("nvml", "0", "0", library_env(lib.parent, config, base)),
        "nvml_mock_bandwidth": ("nvml", "1", "0", library_env(lib.parent, config, base)),
        "nvml_mock_bandwidth_nvlink_18_links": ("nvml", "1", "1", library_env(lib.parent, config, base)),
    }
    result: dict[str, object] = {"goal": "< 2 %"}
    for name, (kind, bw, nv, env) in cases.items():
        res = subprocess.run(
            [sys.executable, "-c", SAMPLER_PROBE, redis_url, str(seconds), kind, bw, nv],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )
        if res.returncode != 0:
            raise SystemExit(res.stderr)
        result[name] = round(float(res.stdout.strip().splitlines()[-1]), 3)
    return result


def spill_replay(r: redis.Redis, tmp: Path, count: int) -> dict[str, object]:
    from gswarm_tasks.names import frames_stream as stream_of
    from gswarm_tasks.profiling.spill import FrameSpill

    gpus = FakeGpuSource(8).sample(True, False)
    t0 = time.time() - count  # one frame a second, as a node at 1 Hz would have spilled them
    frames = [
        {"node": "spill", "seq": i, "time": t0 + i, "gpus": gpus, "host": {"cpu_percent": 1.0}}
        for i in range(count)
    ]
    spill = FrameSpill(tmp / "spill", max_bytes=1 << 34)
    spill.path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(0, count, 1000):
        spill.append(frames[i : i + 1000], 0.0)
    size = spill.path.stat().st_size
    start = time.perf_counter()
    sent = spill.replay(r, "spill-bench")
    gswarm_s = time.perf_counter() - start
    assert sent == count, sent
    raw_stream = stream_of("spill-raw")
    start = time.perf_counter()
    for i in range(0, count, 500):
        pipe = r.pipeline(transaction=False)
        for f in frames[i : i + 500]:
            pipe.xadd(raw_stream, {"data": json.dumps(f)})
        pipe.execute()
    raw_s = time.perf_counter() - start
    r.delete(stream_of("spill-bench"), raw_stream)
    return {
        "frames": count,
        "spill_file_mib": round(size / 2**20, 1),
        "replay_s": round(gswarm_s, 3),
        "frames_per_s": round(count / gswarm_s),
        "raw_pipelined_xadd_s": round(raw_s, 3),
        "ratio_vs_raw": round(raw_s / gswarm_s, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--frames", type=int, default=400, help="8-GPU frames per simulated node")
    ap.add_argument("--latency-seconds", type=float, default=30)
    ap.add_argument("--sampler-seconds", type=float, default=20)
    ap.add_argument("--spilled", type=int, default=10_000, help="8-GPU frames in the spill file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-prof-"))
    fleet = Fleet(tmp, extra_env={"GSWARM_LOG_LEVEL": "WARNING", "GSWARM_FAKE_GPUS": "8"})
    out: dict[str, object] = {}
    try:
        control = fleet.start("control", "control", app_module="gswarm_web.celery_app")
        r = redis.Redis.from_url(fleet.redis_url)
        # 1. throughput: streams exist (the consumer finds them), then a burst of frames is pushed and drained
        gpus = FakeGpuSource(8).sample(True, False)
        body = json.dumps(
            {"node": "x", "seq": 0, "time": time.time(), "gpus": gpus, "host": {"cpu_percent": 1.0}}
        )
        names = [f"sim-{i:03d}" for i in range(args.nodes)]
        for n in names:
            r.xadd(frames_stream(n), {"data": body})
        wait_for(
            lambda: all(r.xinfo_groups(frames_stream(n)) for n in names),
            30,
            "the consumer to find the streams",
        )
        proc = psutil.Process(control.pid)
        c0 = cpu_seconds(proc)
        t0 = time.monotonic()
        for _ in range(args.frames):
            pipe = r.pipeline(transaction=False)
            for n in names:
                pipe.xadd(frames_stream(n), {"data": body})
            pipe.execute()
        total = args.frames * len(names)

        def drained() -> bool:
            lag = sum(
                int(g.get("lag") or 0) + int(g.get("pending") or 0)
                for n in names
                for g in r.xinfo_groups(frames_stream(n))
                if g["name"].decode() == CONTROL_GROUP
            )
            return lag == 0

        wait_for(drained, 300, "the consumer to drain", interval=0.05)
        elapsed = time.monotonic() - t0
        used = cpu_seconds(proc) - c0
        out["aggregation"] = {
            "frames": total,
            "gpu_samples": total * 8,
            "seconds": round(elapsed, 3),
            "gpu_samples_per_s": round(total * 8 / elapsed),
            "gpu_samples_per_cpu_second": round(total * 8 / max(used, 1e-6)),
            "control_worker_cpu_s": round(used, 3),
            "goal": ">= 20,000 GPU samples/s on one core",
        }
        # 2. latency at 1 Hz from a real node worker with 8 fake GPUs
        fleet.start_node("node1")
        lags: list[float] = []
        seen = 0.0
        end = time.monotonic() + args.latency_seconds
        while time.monotonic() < end:
            raw = r.hget(METRICS_LATEST_KEY, "node1")
            if raw:
                f = json.loads(raw)
                if f["time"] != seen:
                    seen = f["time"]
                    lags.append(time.time() - f["time"])
            time.sleep(0.01)
        lags.sort()
        out["latency_to_metrics_latest"] = {
            "samples": len(lags),
            "p50_s": round(statistics.median(lags), 3),
            "p99_s": round(lags[int(0.99 * (len(lags) - 1))], 3),
            "goal": "p99 < 1.5 s",
        }
        # 3. sampler cost at 1 Hz (8 GPUs + real host counters), in a process of its own
        out["sampler_cpu_percent_of_one_core_at_1hz"] = sampler_costs(
            fleet.redis_url, tmp, args.sampler_seconds
        )
        # 4. replay of spilled frames (a node that lost Redis for a while): gswarm's replay vs a raw pipeline
        out["spill_replay"] = spill_replay(r, tmp, args.spilled)
        print(json.dumps(out, indent=2))
        return 0
    finally:
        fleet.close()


if __name__ == "__main__":
    raise SystemExit(main())
