"""Simulated nodes for the fleet benchmark: N nodes heartbeating and sending 1 Hz frames of G GPUs through the real
streams, as node workers do (the same bodies: `node_info` with fake GPUs, the sampler's frame), spread evenly over
each interval. Runs in a process of its own so that its writes cost the measured processes nothing.

    python bench/fleet_sim.py REDIS_URL [--nodes 1000] [--gpus 8] [--heartbeat 5] [--frame-period 1]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gswarm_tasks import names  # noqa: E402
from gswarm_tasks.node.heartbeat import node_info  # noqa: E402
from gswarm_tasks.profiling.nvml import FakeGpuSource  # noqa: E402

STREAM_KEEP = 60  # frames kept per simulated stream: 1,000 nodes x 60 x 3 KB stays under 200 MB of Redis


def node_name(i: int) -> str:
    return f"sim-{i:04d}"


class Simulated:
    """The bodies, built once; `due(now)` sends every heartbeat and frame whose time has come."""

    def __init__(
        self, client: redis.Redis, nodes: int, gpus: int, heartbeat_s: float, frame_s: float
    ) -> None:
        self.client, self.nodes, self.heartbeat_s, self.frame_s = client, nodes, heartbeat_s, frame_s
        source = FakeGpuSource(gpus)
        template = node_info("sim", Path(tempfile.gettempdir()), None, "10.0.0.1", gpu_source=source)
        self.beats = [
            json.dumps(
                {**template, "node": node_name(i), "address": f"10.0.{i // 250}.{i % 250 + 1}", "state": "up"}
            )
            for i in range(nodes)
        ]
        sample = source.sample(True, False)
        host = {"cpu_percent": 12.5, "dram_used_bytes": 64 << 30, "dram_percent": 25.0}
        # the frame as the sampler writes it; `seq` and `time` change with every frame
        self.frame_parts = [
            (
                f'{{"node": "{node_name(i)}", "seq": ',
                f', "gpus": {json.dumps(sample)}, "host": {json.dumps(host)}}}',
            )
            for i in range(nodes)
        ]
        self.start = time.time()
        self.sent_beats = self.sent_frames = 0

    def _frame(self, i: int, seq: int, at: float) -> str:
        head, tail = self.frame_parts[i]
        return f'{head}{seq}, "time": {at}{tail}'

    def due(self, now: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        elapsed = now - self.start
        beats_due = (
            int(elapsed / self.heartbeat_s * self.nodes) + self.nodes
        )  # every node beats once at the start
        while self.sent_beats < beats_due:
            i = self.sent_beats % self.nodes
            body: Any = {"node": node_name(i), "data": self.beats[i]}
            pipe.xadd(names.HEARTBEAT_STREAM, body, maxlen=names.HEARTBEAT_MAXLEN, approximate=True)
            self.sent_beats += 1
        frames_due = int(elapsed / self.frame_s * self.nodes)
        while self.sent_frames < frames_due:
            i, seq = self.sent_frames % self.nodes, self.sent_frames // self.nodes + 1
            frame: Any = {"data": self._frame(i, seq, now)}
            pipe.xadd(names.frames_stream(node_name(i)), frame, maxlen=STREAM_KEEP, approximate=True)
            self.sent_frames += 1
        pipe.execute()


def run(url: str, nodes: int, gpus: int, heartbeat_s: float, frame_s: float, tick_s: float = 0.05) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    sim = Simulated(redis.Redis.from_url(url), nodes, gpus, heartbeat_s, frame_s)
    while not stopping:
        began = time.time()
        sim.due(began)
        time.sleep(max(0.0, tick_s - (time.time() - began)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("redis_url")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--heartbeat", type=float, default=5.0, help="seconds between one node's heartbeats")
    ap.add_argument("--frame-period", type=float, default=1.0, help="seconds between one node's frames")
    args = ap.parse_args()
    run(args.redis_url, args.nodes, args.gpus, args.heartbeat, args.frame_period)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
