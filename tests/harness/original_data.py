"""What the original gswarm left on disk, written as it wrote it (for import and round-trip tests).

`~/.gswarm_profiler_data/<session id>/`: `state.json` (its session manager's checkpoint) and `frames.jsonl` (one
frame a line, as its head built them: ISO local time, values as strings with two decimals, `session_id` and
`session_name` added). `~/.gswarm_model_data/registry.json`: the host's model registry (design document 003: a
`model_status` list with `stored_locations` and `available_services`, and the `node_list`), beside `jobs/` and
`logs/`. And a stopped session's `<name>.json` (`frames` and `summary_by_device`).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

GPUS = (
    ("gpu-box-a", 0, "NVIDIA A100-SXM4-80GB"),
    ("gpu-box-a", 1, "NVIDIA A100-SXM4-80GB"),
    ("gpu-box-b", 0, "NVIDIA H100 80GB HBM3"),
)


def original_frame(i: int, t: datetime, bandwidth: bool = True) -> dict[str, Any]:
    """Frame `i` (from 1) as the original head made it: every GPU of every client, strings with two decimals."""
    frame: dict[str, Any] = {
        "frame_id": i,
        "time": t.isoformat(),
        "gpu_id": [],
        "gpu_util": [],
        "gpu_memory": [],
    }
    if bandwidth:
        frame.update(dram_bandwidth=[], dram_bandwidth_rx=[], dram_bandwidth_tx=[], gpu_bandwidth=[])
    for k, (host, idx, name) in enumerate(GPUS):
        frame["gpu_id"].append(f"{host}:{idx}:{name}")
        frame["gpu_util"].append(f"{(i * 7 + k * 13) % 100:.2f}")
        frame["gpu_memory"].append(f"{(i * 3 + k * 5) % 100 + 0.25:.2f}")
        if bandwidth:
            rx, tx = f"{(i % 5) * 1.5 + k:.2f}", f"{(i % 3) * 0.75:.2f}"
            frame["dram_bandwidth_rx"].append(rx)
            frame["dram_bandwidth_tx"].append(tx)
            frame["dram_bandwidth"].append(str(float(rx) + float(tx)))
    if bandwidth:  # the first layout listed NVLink links, not GPUs
        frame["gpu_bandwidth"].append(
            {"id1": frame["gpu_id"][0], "id2": frame["gpu_id"][1], "utilization": "300.00"}
        )
    return frame


def original_frames(n: int, start: datetime, period_s: float = 1.0) -> list[dict[str, Any]]:
    return [original_frame(i, start + timedelta(seconds=(i - 1) * period_s)) for i in range(1, n + 1)]


def write_profiler_data(root: Path, sessions: dict[str, int], start: datetime) -> dict[str, str]:
    """Sessions named as given with that many frames each; returns name -> session id. The last session was running
    when its head died (`is_active`, no end), and its last line was cut short mid-write."""
    ids = {}
    for k, (name, n) in enumerate(sessions.items()):
        sid = str(uuid.uuid4())
        ids[name] = sid
        d = root / sid
        d.mkdir(parents=True)
        t0 = start + timedelta(hours=k)
        frames = original_frames(n, t0)
        running = k == len(sessions) - 1
        lines = [json.dumps({**f, "session_id": sid, "session_name": name}) for f in frames]
        text = "\n".join(lines) + "\n" + ('{"frame_id": 99999, "time": "20' if running else "")
        (d / "frames.jsonl").write_text(text)
        state = {
            "session_id": sid,
            "name": name,
            "start_time": t0.isoformat(),
            "end_time": None if running else (t0 + timedelta(seconds=n)).isoformat(),
            "is_active": running,
            "frame_count": n,
            "output_filename": f"{name}.json",
            "connected_clients": ["gpu-box-a_ipv4:10.0.0.5:50412", "gpu-box-b_ipv4:10.0.0.6:50413"],
            "gpu_stats": {"total_util": {}, "util_count": {}, "total_memory": {}, "memory_count": {}},
            "last_updated": (t0 + timedelta(seconds=n)).isoformat(),
        }
        (d / "state.json").write_text(json.dumps(state, indent=2))
    return ids


def write_model_data(root: Path, fleet_node: str) -> None:
    """A registry with a model stored on `fleet_node` and elsewhere, one served, and one without a source."""
    root.mkdir(parents=True)
    (root / "jobs").mkdir()
    (root / "logs").mkdir()
    (root / "logs" / "head.log").write_text("2024-05-01 10:00:00 | INFO | head started\n")
    registry = {
        "model_status": [
            {
                "model_name": "tiny-gpt2",
                "model_type": "llm",
                "model_size": 2_400_000,
                "stored_locations": [f"{fleet_node}:disk", "gpu-box-7:dram"],
                "available_services": {"gpu-box-7:gpu0": "http://gpu-box-7:8080"},
                "metadata": {
                    "url": "https://huggingface.co/sshleifer/tiny-gpt2",
                    "description": "a tiny GPT-2",
                },
            },
            {
                "model_name": "llama-7b",
                "model_type": "llm",
                "model_size": 13_968_179_200,
                "stored_locations": ["web"],
                "available_services": {},
                "source_url": "hf://meta-llama/Llama-2-7b-hf",
            },
            {
                "model_name": "mystery",
                "model_type": "vision",
                "stored_locations": [],
                "available_services": {},
            },
        ],
        "node_list": [fleet_node, "gpu-box-7"],
    }
    (root / "registry.json").write_text(json.dumps(registry, indent=2))
    (root / "jobs" / "job_123.json").write_text(json.dumps({"job_id": "job_123", "status": "completed"}))
