"""Scheduler benchmark: every policy on the same generated traces, in one run, every schedule validated.

1. Online, 8 GPUs on one node (loads take the config's seconds) at utilisations 0.5, 0.7 and 0.9: model loads,
   request latency p50/p99, makespan and validator violations per policy, with loads and p99 as ratios of fifo's.
   Goals for `gswarm` at 0.7: loads <= 0.4x fifo, p99 <= 0.25x fifo; and better than `eft` (earliest finish time,
   the reference rule) on both. Zero violations for every policy.
2. Offline, a saturated trace on 8 GPUs: makespan over the lower bound max(GPU-work / GPUs, latest arrival +
   critical path), which ignores loads. Goal for `gswarm`: <= 1.10.
3. The same online trace shape on a two-node fleet with tiers (DRAM, disk, peer, hub): where loads came from.
4. The simulator at scale: 20,000+ steps on 64 GPUs, wall seconds per policy (goal < 10 s each).
5. The command at scale: `gswarm schedule simulate` on a 22,500-step, 64-GPU trace file written by
   `gswarm schedule generate` (6,600 requests, YAML, 1.6 MB), start-up and file reading included: wall seconds
   per policy over --runs runs, median and spread (goal < 2 s each), with the CPU seconds beside them.

The traces come from `gswarm schedule generate`'s built-in config (eight models, one on two GPUs; chains, a
diamond, fan-out) with fixed seeds, so every run measures the same thing.

    python bench/scheduler.py [--requests 1500] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Row  # noqa: E402
from gswarm_web.scheduling import parse_config, parse_fleet, validate  # noqa: E402
from gswarm_web.scheduling.api import prepare, run  # noqa: E402
from gswarm_web.scheduling.generator import bench_config, generate  # noqa: E402

POLICIES = ("fifo", "round_robin", "offline", "online", "eft", "gswarm")
UTILISATIONS = (0.5, 0.7, 0.9)
GPUS = 8
TIERED_FLEET = {
    "nodes": [
        {"name": "node1", "gpus": {"count": 4, "memory_gb": 80}, "dram_gb": 64},
        {"name": "node2", "gpus": {"count": 4, "memory_gb": 80}, "dram_gb": 64},
    ],
    "defaults": {"h2d_gb_per_s": 20, "disk_gb_per_s": 2, "network_gb_per_s": 1.25},
    "hub_gb_per_s": 0.5,
    "models": {name: ["node1:disk"] for name in bench_config()["models"]},
}


def measure(
    config: Any, trace: dict[str, Any], gpus: int | None, mode: str, policy: str, fleet: Any = None
) -> dict:
    """One policy on one trace: its summary, validator violations and wall seconds."""
    workload, parsed_fleet = prepare(config, trace, gpus, fleet, mode)
    t0 = time.perf_counter()
    doc = run(workload, parsed_fleet, policy)
    wall = time.perf_counter() - t0
    violations = validate(doc, workload, parsed_fleet)
    tiers = Counter(
        e["loaded_from"] for e in doc["executions"] for _ in e["gpus"] if e["loaded_from"] != "gpu"
    )
    return {
        **{k: v for k, v in doc["summary"].items() if k not in ("policy", "mode")},
        "violations": len(violations),
        "first_violation": str(violations[0]) if violations else None,
        "wall_s": round(wall, 3),
        "lower_bound": workload.lower_bound(parsed_fleet.gpus),
        "loads_by_tier": dict(tiers),
    }


def online_table(config: Any, requests: int) -> dict[str, dict[str, dict]]:
    """Part 1: every policy at each utilisation, on 8 GPUs, online."""
    out: dict[str, dict[str, dict]] = {}
    for u in UTILISATIONS:
        trace = generate(bench_config(), requests=requests, gpus=GPUS, utilization=u, seed=1)
        out[str(u)] = {p: measure(config, trace, GPUS, "online", p) for p in POLICIES}
    return out


def print_online(table: dict[str, dict[str, dict]]) -> None:
    """Part 1 as a table with ratios to fifo."""
    print(f"\n1. online, {GPUS} GPUs, loads from the config (ratios: x fifo)")
    head = f"{'util':>4}  {'policy':<12}{'loads':>7}{'x':>7}{'p50 s':>9}{'p99 s':>9}{'x':>7}{'makespan':>10}{'viol':>6}"
    print(head)
    for u, rows in table.items():
        fifo = rows["fifo"]
        for p, r in rows.items():
            print(
                f"{u:>4}  {p:<12}{r['model_loads']:>7}{r['model_loads'] / fifo['model_loads']:>7.2f}"
                f"{r['request_latency_p50']:>9.1f}{r['request_latency_p99']:>9.1f}"
                f"{r['request_latency_p99'] / fifo['request_latency_p99']:>7.3f}{r['makespan']:>10.0f}"
                f"{r['violations']:>6}"
            )


CLI_POLICIES = ("fifo", "round_robin", "offline", "online", "gswarm")  # eft is not offered by the command


def cli_rows(runs: int) -> list[Row]:
    """Part 5: the whole command per policy, as a user runs it on a generated trace file."""
    gswarm = str(Path(sys.executable).with_name("gswarm"))
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-sched-"))
    trace, config = tmp / "trace.yaml", tmp / "config.json"
    subprocess.run(
        [gswarm, "schedule", "generate", "--write-config", str(config), "--output", str(trace)]
        + ["--count", "6600", "--gpus", "64", "--utilization", "0.7", "--seed", "3"],
        check=True,
        capture_output=True,
    )
    argv = [gswarm, "schedule", "simulate", "--config", str(config), "--requests", str(trace), "--gpus", "64"]
    rows, size = [], trace.stat().st_size >> 10
    for policy in CLI_POLICIES:
        walls, cpus = [], []
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run(
                [*argv, "--policy", policy], check=True, capture_output=True, text=True
            ).stdout
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            assert "22507" in out, out  # every step of the trace simulated
        name = f"gswarm schedule simulate --policy {policy} (22,507 steps, 64 GPUs, {size} KiB of YAML)"
        rows.append(Row(name, walls, "s", "< 2", lambda v: v < 2))
        rows.append(Row(f"  of which CPU seconds ({policy})", cpus, "s", "info", None))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per online trace")
    parser.add_argument("--json", action="store_true", help="print the results as JSON as well")
    parser.add_argument("--runs", type=int, default=3, help="runs of each command in part 5")
    parser.add_argument("--only-cli", action="store_true", help="part 5 only")
    args = parser.parse_args()
    if args.only_cli:
        rows = cli_rows(args.runs)
        print("\n5. the command, start-up and file reading included")
        for row in rows:
            print(row.line())
        return 0 if all(r.ok() for r in rows) else 1
    config = parse_config(bench_config())
    results: dict[str, Any] = {"online": online_table(config, args.requests)}
    print_online(results["online"])

    saturated = generate(bench_config(), requests=args.requests * 2 // 3, gpus=GPUS, utilization=1.0, seed=2)
    offline = {p: measure(config, saturated, GPUS, "offline", p) for p in POLICIES}
    results["offline"] = offline
    print(
        f"\n2. offline, {GPUS} GPUs, saturated trace: makespan / lower bound {offline['fifo']['lower_bound']:.0f} s"
    )
    for p, r in offline.items():
        ratio = r["makespan"] / r["lower_bound"]
        print(
            f"   {p:<12}{r['makespan']:>9.0f} s {ratio:>6.3f}x  loads {r['model_loads']:>5}  viol {r['violations']}"
        )

    trace = generate(bench_config(), requests=args.requests, gpus=GPUS, utilization=0.7, seed=1)
    fleet = parse_fleet(TIERED_FLEET)
    tiered = {p: measure(config, trace, None, "online", p, fleet) for p in ("fifo", "eft", "gswarm")}
    results["tiered"] = tiered
    print("\n3. online at 0.7 on two 4-GPU nodes with tiers (weights start on node1's disk): loads by tier")
    for p, r in tiered.items():
        print(
            f"   {p:<8} loads {r['model_loads']:>5} ({r['load_seconds']:>7.0f} GPU-s) p99 "
            f"{r['request_latency_p99']:>7.1f} s  {r['loads_by_tier']}  viol {r['violations']}"
        )

    big = generate(bench_config(), requests=5900, gpus=64, utilization=0.7, seed=3)
    scale = {p: measure(config, big, 64, "online", p) for p in POLICIES}
    results["scale"] = scale
    print(f"\n4. {scale['fifo']['steps']} steps on 64 GPUs: simulation wall seconds (policy included)")
    print("   " + "  ".join(f"{p} {r['wall_s']:.2f}s" for p, r in scale.items()))

    cli = cli_rows(args.runs)
    print("\n5. the command, start-up and file reading included")
    for row in cli:
        print(row.line())

    at = results["online"]["0.7"]
    goals = {
        "gswarm loads <= 0.4x fifo at 0.7": at["gswarm"]["model_loads"] <= 0.4 * at["fifo"]["model_loads"],
        "gswarm p99 <= 0.25x fifo at 0.7": at["gswarm"]["request_latency_p99"]
        <= 0.25 * at["fifo"]["request_latency_p99"],
        "gswarm beats eft on loads and p99 at 0.7": at["gswarm"]["model_loads"] < at["eft"]["model_loads"]
        and at["gswarm"]["request_latency_p99"] < at["eft"]["request_latency_p99"],
        "gswarm offline <= 1.10x lower bound": offline["gswarm"]["makespan"]
        <= 1.10 * offline["gswarm"]["lower_bound"],
        "zero violations everywhere": all(
            r["violations"] == 0
            for part in (*results["online"].values(), offline, tiered, scale)
            for r in part.values()
        ),
        "every policy simulates 20k steps on 64 GPUs in < 10 s": all(
            r["wall_s"] < 10 for r in scale.values()
        ),
        "gswarm schedule simulate on 22.5k steps < 2 s (median), every policy": all(r.ok() for r in cli),
    }
    results["goals"] = goals
    print("\ngoals")
    for name, ok in goals.items():
        print(f"   {'met   ' if ok else 'MISSED'} {name}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
