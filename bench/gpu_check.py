"""The GPU path on a real NVIDIA host, checked against the driver's own tools.

1. NVML sampling as a node samples (profiling.nvml -> nvitop -> libnvidia-ml) beside `nvidia-smi` at the same
   moments, while a matmul load and host-to-GPU copies run: utilization, memory, temperature, power, clocks,
   PCIe throughput, and the GPU processes by name.
2. The `gpuN` tier: `gswarm_tasks.models.gpu_holder` loads 1 GiB of safetensors into GPU memory; NVML and nvidia-smi
   see it held, and freed when the holder stops.
3. Serving on `gpu0`: `gswarm_tasks.serving.model_server --device cuda:0` answers /v1/embeddings, equal to the same
   model on the CPU.

usage: python bench/gpu_check.py [--model DIR] [--out report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMI_FIELDS = ",".join(
    (
        "index,name,uuid,utilization.gpu,memory.used,memory.total",
        "temperature.gpu,power.draw,clocks.sm,clocks.mem,pci.bus_id",
    )
)


def smi() -> dict[str, Any]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    keys = SMI_FIELDS.split(",")
    return dict(zip(keys, (v.strip() for v in out.split(",")), strict=True))


def smi_pcie() -> dict[str, Any]:
    """`nvidia-smi dmon -s t`: PCIe rx/tx over the last second, in MB/s."""
    lines = subprocess.run(
        ["nvidia-smi", "dmon", "-s", "t", "-c", "1"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    header = lines[0].lstrip("#").split()
    values = next(line.split() for line in lines if not line.startswith("#"))
    return dict(zip(header, values, strict=False))


def load_gpu(stop: threading.Event, running: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    running.set()
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        dev.copy_(host, non_blocking=True)  # host -> GPU: PCIe rx on the GPU's side
        torch.cuda.synchronize()


def sampling(seconds: int) -> dict[str, Any]:
    from gswarm_tasks.profiling.nvml import NvitopSource

    src = NvitopSource()
    gpus = src.gpus()
    stop, running = threading.Event(), threading.Event()
    worker = threading.Thread(target=load_gpu, args=(stop, running), daemon=True)
    worker.start()
    if not running.wait(120):
        raise RuntimeError("the GPU load did not start")
    time.sleep(2)  # utilization is averaged over the last second or so
    pairs = []
    for _ in range(seconds):
        t = time.time()
        ours = src.sample(True, True)
        theirs = smi()
        pcie = smi_pcie()
        pairs.append({"time": t, "gswarm": ours, "nvidia_smi": theirs, "nvidia_smi_dmon": pcie})
    stop.set()
    worker.join(30)
    return {"gpus": gpus, "pairs": pairs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen[str], marker: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return line
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
    raise RuntimeError(f"no {marker!r} within {timeout} s")


def gpu_tier() -> dict[str, Any]:
    import requests
    import torch
    from safetensors.torch import save_file

    from gswarm_tasks.profiling.nvml import NvitopSource

    d = Path(tempfile.mkdtemp())
    save_file(
        {f"w{i}": torch.randn(64 * 2**20 // 4 * 4, dtype=torch.float32) for i in range(4)},
        str(d / "w.safetensors"),
    )
    before = int(smi()["memory.used"])
    port = free_port()
    t0 = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "gswarm_tasks.models.gpu_holder",
        "--model-path",
        str(d),
        "--device",
        "cuda:0",
    ]
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_ready(proc, "gswarm-gpu-holder ready", 120)
    ready_s = time.monotonic() - t0
    health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    held = int(smi()["memory.used"])
    procs = NvitopSource().sample(False, False)[0].get("processes", [])
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    time.sleep(1)
    after = int(smi()["memory.used"])
    return {
        "file_bytes": (d / "w.safetensors").stat().st_size,
        "ready_s": round(ready_s, 2),
        "health": health,
        "nvidia_smi_used_mib": {"before": before, "held": held, "after_stop": after},
        "nvml_processes_while_held": [p for p in procs if p.get("pid") == proc.pid] or procs,
    }


def serving(model: Path) -> dict[str, Any]:
    import requests
    from sentence_transformers import SentenceTransformer

    from gswarm_tasks.profiling.nvml import NvitopSource

    port = free_port()
    t0 = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "gswarm_tasks.serving.model_server",
        "--model-path",
        str(model),
        "--model-name",
        "minilm",
    ]
    proc = subprocess.Popen(
        [*argv, "--device", "cuda:0", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_ready(proc, "gswarm-model-server ready", 300)
        ready_s = time.monotonic() - t0
        texts = ["the GPU holds the weights", "a fleet of hosts serves one model"]
        r = requests.post(
            f"http://127.0.0.1:{port}/v1/embeddings", json={"model": "minilm", "input": texts}, timeout=60
        )
        got = [d["embedding"] for d in r.json()["data"]]
        lat = []
        with requests.Session() as http:  # keep-alive, as a gateway would hold it
            for _ in range(100):
                t = time.perf_counter()
                http.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"input": texts[:1]}, timeout=60)
                lat.append(time.perf_counter() - t)
        health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        procs = NvitopSource().sample(False, False)[0].get("processes", [])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    cpu = SentenceTransformer(str(model), device="cpu").encode(texts)
    cos = [
        float(
            sum(a * b for a, b in zip(g, c, strict=True))
            / ((sum(a * a for a in g) * sum(b * b for b in c)) ** 0.5)
        )
        for g, c in zip(got, cpu.tolist(), strict=True)
    ]
    lat.sort()
    return {
        "ready_s": round(ready_s, 2),
        "health": health,
        "dims": len(got[0]),
        "cosine_gpu_vs_cpu": cos,
        "latency_ms_p50": round(lat[len(lat) // 2] * 1000, 2),
        "latency_ms_p99": round(lat[-1] * 1000, 2),
        "nvml_processes": procs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / ".gpu" / "minilm")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    args = ap.parse_args()
    report: dict[str, Any] = {}
    for name, fn in (
        ("sampling", lambda: sampling(args.seconds)),
        ("gpu_tier", gpu_tier),
        ("serving", lambda: serving(args.model)),
    ):
        t = time.monotonic()
        try:
            report[name] = fn()
        except Exception as exc:  # one part failing must not hide the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {time.monotonic() - t:.1f} s", flush=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(
        json.dumps(
            {k: (v if k != "sampling" else {"pairs": len(v.get("pairs", []))}) for k, v in report.items()},
            default=str,
        )[:6000]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
