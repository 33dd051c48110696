"""Transfer benchmark: gswarm's model copies against `cp` and `curl` of the same files, in one run.

1. same-node `disk -> dram` copy of a ~1 GiB model through the API and a real node worker, vs `cp -r`;
2. cross-node copy `node1:disk -> node2:disk` over loopback (two real node workers), vs `curl` of the same file
   from `python -m http.server`.
Each timing runs from the POST to the moment the API reports the task succeeded (verified and recorded).
Prints medians and the ratio baseline_time / gswarm_time (>= 1 means gswarm is as fast).

    python bench/transfer.py [--size-mib 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.fleet import Fleet  # noqa: E402
from tests.integration.procs import wait_for  # noqa: E402


def make_model(root: Path, size_mib: int) -> Path:
    d = root / "bench-model"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "bench", "hidden_size": 1024}))
    with open(d / "model.safetensors", "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(size_mib):
            f.write(block[i % 251 :] + block[: i % 251])
    return d


NODE_TIMES: list[float] = []


def run_copy(fleet: Fleet, body: dict[str, str]) -> float:
    t0 = time.perf_counter()
    code, task = fleet.post("/models/bench/copy", body)
    assert code == 202, task

    def done() -> bool:
        code, t = fleet.get(f"/queue/tasks/{task['task_id']}")
        if t["status"] == "failed":
            raise SystemExit(f"copy failed: {t['error']}")
        if t["status"] == "succeeded":
            NODE_TIMES.append(t["result"]["elapsed_s"])
        return bool(t["status"] == "succeeded")

    wait_for(done, 300, "the copy", interval=0.01)
    return time.perf_counter() - t0


def drop(fleet: Fleet, device: str) -> None:
    code, task = fleet.api("DELETE", f"/models/bench/locations/{device}")
    assert code == 202, task
    wait_for(lambda: fleet.get(f"/queue/tasks/{task['task_id']}")[1]["status"] == "succeeded", 60, "delete")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=6)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-transfer-"))
    src = make_model(tmp / "src", args.size_mib)
    fleet = Fleet(
        tmp, redis_db=13, extra_env={"GSWARM_MODELS_ALLOWED_ROOTS": str(tmp / "src"), "GSWARM_LOG_LEVEL": "WARNING"}
    )
    server = None
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        fleet.start_node("node2")
        fleet.register_and_download("bench", f"file://{src}")
        stored = fleet.storage("node1") / "models" / "bench"
        size = sum(p.stat().st_size for p in stored.rglob("*") if p.is_file() and not p.name.startswith(".gswarm"))
        subprocess.run(["cat", str(stored / "model.safetensors")], stdout=subprocess.DEVNULL, check=True)

        def timed_cp(dest: Path) -> float:
            t0 = time.perf_counter()
            subprocess.run(["cp", "-r", str(stored), str(dest)], check=True)
            return time.perf_counter() - t0

        def timed_curl(out: Path) -> float:
            t0 = time.perf_counter()
            subprocess.run(["curl", "-sf", "-o", str(out), f"http://127.0.0.1:{port}/model.safetensors"], check=True)
            return time.perf_counter() - t0

        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(stored)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: (
                subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/config.json"]).returncode
                == 0
            ),
            10,
            "http.server",
        )
        # Alternate which side goes first, and flush dirty pages before every timed run, so that neither side
        # pays for the other's writeback.
        local_g, local_cp, remote_g, remote_curl = [], [], [], []
        for i in range(args.repeat):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                os.sync()
                if side == 0:
                    local_g.append(run_copy(fleet, {"source_device": "node1:disk", "target_device": "node1:dram"}))
                    drop(fleet, "node1:dram")
                else:
                    dest = fleet.dram_base / "cp-baseline"
                    local_cp.append(timed_cp(dest))
                    shutil.rmtree(dest)
        for i in range(args.repeat):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                os.sync()
                if side == 0:
                    remote_g.append(run_copy(fleet, {"source_device": "node1:disk", "target_device": "node2:disk"}))
                    drop(fleet, "node2:disk")
                else:
                    out = fleet.storage("node2") / "curl-baseline.bin"
                    remote_curl.append(timed_curl(out))
                    out.unlink()

        def row(name: str, ours: list[float], base: list[float], goal: float) -> dict[str, object]:
            g, b = statistics.median(ours), statistics.median(base)
            return {
                "case": name,
                "gswarm_s": round(g, 3),
                "baseline_s": round(b, 3),
                "gswarm_MB_per_s": round(size / g / 1e6, 1),
                "baseline_MB_per_s": round(size / b / 1e6, 1),
                "ratio": round(b / g, 2),
                "goal": goal,
                "pass": b / g >= goal,
                "gswarm_samples_s": [round(x, 3) for x in ours],
                "baseline_samples_s": [round(x, 3) for x in base],
            }

        rows = [
            row("same-node disk->dram vs cp", local_g, local_cp, 0.9),
            row("cross-node copy vs curl", remote_g, remote_curl, 0.8),
        ]
        print(json.dumps({"bytes": size, "repeat": args.repeat, "results": rows, "node_side_s": NODE_TIMES}, indent=2))
        for r in rows:
            print(
                f"{'PASS' if r['pass'] else 'MISS'} {r['case']}: ratio {r['ratio']} (goal >= {r['goal']}),"
                f" gswarm {r['gswarm_s']} s, baseline {r['baseline_s']} s"
            )
        return 0
    finally:
        if server is not None:
            server.terminate()
        fleet.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
