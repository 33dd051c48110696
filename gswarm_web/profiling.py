"""Profiling on the control side: the frames consumer, session windows, summaries, and metric formats."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime
from typing import Any

import redis

from gswarm_tasks.profiler import FRAMES_KEY

log = logging.getLogger(__name__)

LATEST_KEY = "gswarm:metrics:latest"
GROUP = "control"


class FramesConsumer:
    """Reads every node's frame stream through one consumer group; keeps each node's newest frame.

    Streams are found by name (`gswarm:frames:*`) every few seconds, so a new node needs no restart.
    """

    def __init__(self, client: redis.Redis, consumer: str, batch: int = 5000, block_ms: int = 500) -> None:
        self.client = client
        self.consumer = consumer
        self.batch = batch
        self.block_ms = block_ms
        self.streams: dict[Any, Any] = {}
        self._next_scan = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.frames = 0

    def discover(self) -> None:
        for key in self.client.scan_iter(match=FRAMES_KEY.format("*"), count=1000):
            name = key.decode() if isinstance(key, bytes) else key
            if name not in self.streams:
                try:
                    self.client.xgroup_create(name, GROUP, id="$", mkstream=True)
                except redis.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
                self.streams[name] = ">"
        self._next_scan = time.monotonic() + 5.0

    def poll_once(self, block_ms: int | None = None) -> int:
        if time.monotonic() >= self._next_scan:
            self.discover()
        if not self.streams:
            self._stop.wait(0.5)
            return 0
        res: Any = self.client.xreadgroup(
            GROUP, self.consumer, self.streams, count=self.batch, block=self.block_ms if block_ms is None else block_ms
        )
        if not res:
            return 0
        pipe = self.client.pipeline(transaction=False)
        n = 0
        for stream, entries in res:
            if not entries:
                continue
            newest = entries[-1][1].get(b"data")
            node = (stream.decode() if isinstance(stream, bytes) else stream).rsplit(":", 1)[-1]
            if newest is not None:
                pipe.hset(LATEST_KEY, node, newest)
            pipe.xack(stream, GROUP, *[eid for eid, _ in entries])
            n += len(entries)
        pipe.hset(LATEST_KEY + ":seen", "control", time.time())
        pipe.execute()
        self.frames += n
        return n

    def run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.poll_once()
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("frames consumer failing, will retry: %s", exc)
                failing = True
                self.streams.clear()
                self._stop.wait(1.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gswarm-frames", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)


def frames_consumer(redis_url: str, consumer: str | None = None) -> FramesConsumer:
    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    return FramesConsumer(client, consumer or f"frames-{os.getpid()}")


# ---- sessions -----------------------------------------------------------------------------------------------


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def session_frames(client: redis.Redis, nodes: list[str], start: datetime, end: datetime | None) -> list[dict]:
    """Every frame of `nodes` inside [start, end]: stream ids are Redis times, so a window is one XRANGE."""
    lo, hi = str(_ms(start)), str(_ms(end)) if end else "+"
    frames = []
    for node in nodes:
        last = lo
        while True:
            chunk: Any = client.xrange(FRAMES_KEY.format(node), min=last, max=hi, count=10_000)
            if not chunk:
                break
            for _eid, fields in chunk:
                frames.append(json.loads(fields[b"data"]))
            last = "(" + (chunk[-1][0].decode() if isinstance(chunk[-1][0], bytes) else chunk[-1][0])
            if len(chunk) < 10_000:
                break
    frames.sort(key=lambda f: (f["time"], f["node"]))
    return frames


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "max": None, "p95": None}
    return {"mean": round(sum(values) / len(values), 3), "max": max(values), "p95": _pct(values, 95)}


def at_frequency(frames: list[dict], period_s: float) -> list[dict]:
    """A session's own rate: when an overlapping session samples faster, keep one frame per period per node."""
    kept: list[dict] = []
    last: dict[str, float] = {}
    for f in frames:
        if f["time"] - last.get(f["node"], -1e18) >= period_s * 0.75:  # tolerate scheduling jitter
            kept.append(f)
            last[f["node"]] = f["time"]
    return kept


def export_document(
    name: str, start: datetime, end: datetime | None, frames: list[dict], bandwidth: bool, nvlink: bool
) -> dict[str, Any]:
    """The export shape of DESIGN.md: one entry per GPU reading, plus summaries per device and per node."""
    out_frames = []
    per_dev: dict[str, dict[str, list[float]]] = {}
    per_node: dict[str, dict[str, list[float]]] = {}
    for fid, f in enumerate(frames):
        host = f.get("host") or {}
        nd = per_node.setdefault(f["node"], {"cpu_percent": [], "dram_percent": []})
        for key in nd:
            if isinstance(host.get(key), int | float):
                nd[key].append(float(host[key]))
        for g in f.get("gpus") or []:
            gid = f"{f['node']}:{g.get('index')}:{g.get('name')}"
            row: dict[str, Any] = {
                "frame_id": fid,
                "time": f["time"],
                "gpu_id": gid,
                "gpu_util": g.get("utilization_percent"),
                "gpu_memory": g.get("memory_percent"),
            }
            if bandwidth:
                row["pcie_rx_bytes_per_s"] = g.get("pcie_rx_bytes_per_s")
                row["pcie_tx_bytes_per_s"] = g.get("pcie_tx_bytes_per_s")
            if nvlink:
                row["nvlink_rx_bytes_per_s"] = g.get("nvlink_rx_bytes_per_s")
                row["nvlink_tx_bytes_per_s"] = g.get("nvlink_tx_bytes_per_s")
            out_frames.append(row)
            d = per_dev.setdefault(gid, {"gpu_util": [], "gpu_memory": []})
            for key in d:
                if isinstance(row[key], int | float):
                    d[key].append(float(row[key]))
    return {
        "session_name": name,
        "start_time": start.isoformat(),
        "end_time": end.isoformat() if end else None,
        "frames": out_frames,
        "summary_by_device": {
            gid: {
                "samples": len(v["gpu_util"]),
                "gpu_util": _stats(v["gpu_util"]),
                "gpu_memory": _stats(v["gpu_memory"]),
            }
            for gid, v in per_dev.items()
        },
        "summary_by_node": {
            n: {
                "frames": len(v["cpu_percent"]),
                "cpu_percent": _stats(v["cpu_percent"]),
                "dram_percent": _stats(v["dram_percent"]),
            }
            for n, v in per_node.items()
        },
    }


# ---- Prometheus ---------------------------------------------------------------------------------------------

# NVIDIA's DCGM exporter names and units, so its Grafana dashboards work unchanged (FB in MiB, power in W).
DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.get("utilization_percent")),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        lambda g: g["memory_used_bytes"] / 2**20 if g.get("memory_used_bytes") is not None else None,
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda g: (
            (g["memory_total_bytes"] - g["memory_used_bytes"]) / 2**20
            if g.get("memory_total_bytes") is not None and g.get("memory_used_bytes") is not None
            else None
        ),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.get("temperature_c")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.get("power_w")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.get("sm_clock_mhz")),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.get("memory_clock_mhz")),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus (in bytes/s).",
        lambda g: g.get("pcie_rx_bytes_per_s"),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus (in bytes/s).",
        lambda g: g.get("pcie_tx_bytes_per_s"),
    ),
)
HOST = (
    ("gswarm_host_cpu_percent", "Host CPU utilization (in %).", "cpu_percent"),
    ("gswarm_host_dram_used_bytes", "Host memory used (in bytes).", "dram_used_bytes"),
    ("gswarm_host_dram_percent", "Host memory used (in %).", "dram_percent"),
    ("gswarm_host_disk_read_bytes_per_second", "Disk read throughput.", "disk_read_bytes_per_s"),
    ("gswarm_host_disk_write_bytes_per_second", "Disk write throughput.", "disk_write_bytes_per_s"),
    ("gswarm_host_network_receive_bytes_per_second", "Network receive throughput.", "net_rx_bytes_per_s"),
    ("gswarm_host_network_transmit_bytes_per_second", "Network transmit throughput.", "net_tx_bytes_per_s"),
)


def _label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(latest: dict[str, dict[str, Any]]) -> str:
    lines: list[str] = []
    for name, help_, get in DCGM:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for node, f in sorted(latest.items()):
            for g in f.get("gpus") or []:
                value = get(g)
                if value is None:
                    continue
                labels = (
                    f'gpu="{g.get("index")}",UUID="{_label(g.get("uuid"))}",device="nvidia{g.get("index")}",'
                    f'modelName="{_label(g.get("name"))}",Hostname="{_label(node)}"'
                )
                lines.append(f"{name}{{{labels}}} {float(value)}")
    for name, help_, key in HOST:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for node, f in sorted(latest.items()):
            value = (f.get("host") or {}).get(key)
            if isinstance(value, int | float):
                lines.append(f'{name}{{Hostname="{_label(node)}"}} {float(value)}')
    lines += [
        "# HELP gswarm_frame_age_seconds Seconds since the node's newest frame.",
        "# TYPE gswarm_frame_age_seconds gauge",
    ]
    now = time.time()
    for node, f in sorted(latest.items()):
        lines.append(f'gswarm_frame_age_seconds{{Hostname="{_label(node)}"}} {round(now - float(f["time"]), 3)}')
    return "\n".join(lines) + "\n"
