"""Profiling sessions: named time windows over the nodes' frame streams, published to the nodes' samplers while
active; a window's frames at the session's own rate, its export document and its summaries."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import redis

from gswarm_tasks import names
from gswarm_tasks.errors import NotFound

from ..extensions import db, redis_client
from ..tables import Node, ProfilerSession


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def session_frames(client: redis.Redis, nodes: list[str], start: datetime, end: datetime | None) -> list[dict]:
    """Every frame of `nodes` inside [start, end]: stream ids are Redis times, so a window is one XRANGE."""
    lo, hi = str(_ms(start)), str(_ms(end)) if end else "+"
    frames = []
    for node in nodes:
        last = lo
        while True:
            chunk: Any = client.xrange(names.frames_stream(node), min=last, max=hi, count=10_000)
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


def publish(s: ProfilerSession) -> None:
    """Tell the nodes' samplers about an active session (they read this hash every second)."""
    doc = {
        "freq_ms": s.freq_ms,
        "nodes": s.nodes,
        "enable_bandwidth": s.enable_bandwidth,
        "enable_nvlink": s.enable_nvlink,
    }
    redis_client().hset(names.PROFILER_SESSIONS_KEY, s.name, json.dumps(doc))


def unpublish(name: str) -> None:
    redis_client().hdel(names.PROFILER_SESSIONS_KEY, name)


def get_session(name: str) -> ProfilerSession:
    s = db.session.get(ProfilerSession, name)
    if s is None:
        raise NotFound(f"no profiling session {name!r}", {"name": name})
    return s


def session_nodes(s: ProfilerSession) -> list[str]:
    return list(s.nodes) or sorted(db.session.scalars(db.select(Node.name)))


def document(s: ProfilerSession) -> dict[str, Any]:
    """The session's export document, from the frame streams."""
    frames = at_frequency(session_frames(redis_client(), session_nodes(s), s.start_time, s.end_time), s.freq_ms / 1000)
    return export_document(s.name, s.start_time, s.end_time, frames, s.enable_bandwidth, s.enable_nvlink)
