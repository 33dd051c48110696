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


HOST_KEYS = (
    "cpu_percent",
    "dram_used_bytes",
    "dram_percent",
    "disk_read_bytes_per_s",
    "disk_write_bytes_per_s",
    "net_rx_bytes_per_s",
    "net_tx_bytes_per_s",
)
GPU_KEYS = {"gpu_util": "utilization_percent", "gpu_memory": "memory_percent"}


def _gpu_row(fid: int, f: dict[str, Any], g: dict[str, Any], bandwidth: bool, nvlink: bool) -> dict[str, Any]:
    """One GPU reading as the export lists it; a field the GPU did not report is absent."""
    row: dict[str, Any] = {
        "frame_id": fid,
        "time": f["time"],
        "gpu_id": f"{f['node']}:{g.get('index')}:{g.get('name')}",
    }
    for out, key in GPU_KEYS.items():
        row[out] = g.get(key)
    wanted = (("pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s") if bandwidth else ()) + (
        ("nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s") if nvlink else ()
    )
    row.update({k: g[k] for k in wanted if g.get(k) is not None})
    return row


def _host_row(fid: int, f: dict[str, Any]) -> dict[str, Any]:
    host = f.get("host") or {}
    return {
        "frame_id": fid,
        "time": f["time"],
        "node": f["node"],
        **{k: host[k] for k in HOST_KEYS if isinstance(host.get(k), int | float)},
    }


def export_document(
    name: str, start: datetime, end: datetime | None, frames: list[dict], bandwidth: bool, nvlink: bool
) -> dict[str, Any]:
    """The export shape of DESIGN.md: one entry per GPU reading (`frames`) and per host reading (`host_frames`),
    in one time base, with summaries per device and per node."""
    gpu_rows: list[dict[str, Any]] = []
    host_rows: list[dict[str, Any]] = []
    for fid, f in enumerate(frames):
        host_rows.append(_host_row(fid, f))
        gpu_rows.extend(_gpu_row(fid, f, g, bandwidth, nvlink) for g in f.get("gpus") or [])
    per_dev: dict[str, list[dict[str, Any]]] = {}
    for row in gpu_rows:
        per_dev.setdefault(row["gpu_id"], []).append(row)
    per_node: dict[str, list[dict[str, Any]]] = {}
    for row in host_rows:
        per_node.setdefault(row["node"], []).append(row)
    return {
        "session_name": name,
        "start_time": start.isoformat(),
        "end_time": end.isoformat() if end else None,
        "frames": gpu_rows,
        "host_frames": host_rows,
        "summary_by_device": {
            gid: {"samples": len(rows), **{k: _stats(_values(rows, k)) for k in GPU_KEYS}}
            for gid, rows in per_dev.items()
        },
        "summary_by_node": {
            node: {"frames": len(rows), **{k: _stats(_values(rows, k)) for k in HOST_KEYS}}
            for node, rows in per_node.items()
        },
    }


def _values(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]


def frame_counts(doc: dict[str, Any]) -> tuple[int, int]:
    """(GPU frames, host frames) of an export: frames with at least one GPU reading, and every frame."""
    return len({f["frame_id"] for f in doc["frames"]}), len(doc["host_frames"])


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
