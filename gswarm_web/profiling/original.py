"""The original gswarm profiler's file layout, both ways (pure Python).

Its head took, once per tick, the newest reading of every GPU of every connected client and wrote one frame: a
`frame_id` counted from 1, the `time` (ISO 8601), and parallel arrays `gpu_id` (`hostname:index:name`), `gpu_util`
and `gpu_memory` (percent), with bandwidth `dram_bandwidth`, `dram_bandwidth_rx`, `dram_bandwidth_tx` (PCIe, GB/s)
and with NVLink `gpu_bandwidth` (GB/s); `summary_by_device` held `avg_gpu_util` and `avg_gpu_memory` per GPU. gswarm's
nodes sample on their own clocks, so a frame here gathers one reading of each node (a new frame starts when a node
comes round again, or a period has passed) and lists every GPU seen so far with its newest reading, as the original
did. Numbers are numbers where the original wrote strings with two decimals (`float()` reads both); `gpu_bandwidth`
is each GPU's NVLink rx + tx where the original listed links. Its sessions directory (`.gswarm_profiler_data/<id>/`:
`state.json`, `frames.jsonl`) reads back into frames of gswarm's nodes.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .export import gpu_id, split_gpu_id

GB = 1e9
LIST_KEYS = ("gpu_id", "gpu_util", "gpu_memory")


def iso(t: float) -> str:
    """A time as the original wrote it (ISO 8601, local time), with its UTC offset so no reader has to guess."""
    return datetime.fromtimestamp(t, UTC).astimezone().isoformat()


def epoch(value: Any) -> float:
    """Seconds since the epoch from the original's ISO time (naive: local, as it wrote it) or a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _r2(value: float | None, scale: float = 1.0) -> float | None:
    return None if value is None else round(value / scale, 2)


class ToOriginal:
    """gswarm frames (in the export's order) in, original frames out; `summary()` once all went through."""

    def __init__(self, period_s: float, bandwidth: bool, nvlink: bool) -> None:
        self.period_s = max(period_s, 1e-3)
        self.bandwidth, self.nvlink = bandwidth, nvlink
        self.latest: dict[str, dict[str, Any]] = {}  # gpu id -> newest reading
        # The frames' GPU order: a GPU keeps its place once listed (the original's readers index the arrays by
        # position); those first listed in the same frame go in order of host and index, whichever sampled first.
        self.order: list[str] = []
        self.group: set[str] = set()
        self.first_t = self.last_t = 0.0
        self.times: set[float] = set()  # the times of this frame's readings
        self.fid = 0
        self.sums: dict[str, list[float]] = {}  # gpu id -> [util sum, util n, memory sum, memory n]

    def add(self, f: dict[str, Any]) -> list[dict[str, Any]]:
        """Take one node's frame; returns the original frame it completed, if any."""
        out = []
        if self.group and self._new_frame(f):
            out.append(self._emit())
        if not self.group:
            self.first_t = f["time"]
            self.times = set()
        self.group.add(f["node"])
        self.times.add(f["time"])
        self.last_t = max(self.last_t, f["time"]) if len(self.group) > 1 else f["time"]
        for g in f.get("gpus") or []:
            self.latest[gpu_id(f["node"], g)] = g
        return out

    def _new_frame(self, f: dict[str, Any]) -> bool:
        """Whether `f` begins the next frame: its node is in this one already, a period has passed, or this one's
        readings share one time (an original frame read back) and `f` has another."""
        if f["node"] in self.group or f["time"] - self.first_t >= self.period_s * 0.999:
            return True
        return len(self.group) > 1 and len(self.times) == 1 and f["time"] not in self.times

    def finish(self) -> list[dict[str, Any]]:
        return [self._emit()] if self.group else []

    def _emit(self) -> dict[str, Any]:
        self.fid += 1
        self.group = set()
        frame: dict[str, Any] = {"frame_id": self.fid, "time": iso(self.last_t)}
        if len(self.order) < len(self.latest):
            listed = set(self.order)
            self.order += sorted((i for i in self.latest if i not in listed), key=_gpu_key)
        ids = list(self.order)
        frame["gpu_id"] = ids
        frame["gpu_util"] = [_r2(_num(self.latest[i].get("utilization_percent"))) for i in ids]
        frame["gpu_memory"] = [_r2(_num(self.latest[i].get("memory_percent"))) for i in ids]
        if self.bandwidth:
            rx = [_num(self.latest[i].get("pcie_rx_bytes_per_s")) for i in ids]
            tx = [_num(self.latest[i].get("pcie_tx_bytes_per_s")) for i in ids]
            frame["dram_bandwidth"] = [_sum_gb(a, b) for a, b in zip(rx, tx, strict=True)]
            frame["dram_bandwidth_rx"] = [_r2(a, GB) for a in rx]
            frame["dram_bandwidth_tx"] = [_r2(b, GB) for b in tx]
        if self.nvlink:
            frame["gpu_bandwidth"] = [
                _sum_gb(
                    _num(self.latest[i].get("nvlink_rx_bytes_per_s")),
                    _num(self.latest[i].get("nvlink_tx_bytes_per_s")),
                )
                for i in ids
            ]
        for i, util, mem in zip(ids, frame["gpu_util"], frame["gpu_memory"], strict=True):
            acc = self.sums.setdefault(i, [0.0, 0, 0.0, 0])
            if util is not None:
                acc[0], acc[1] = acc[0] + util, acc[1] + 1
            if mem is not None:
                acc[2], acc[3] = acc[2] + mem, acc[3] + 1
        return frame

    def summary(self) -> dict[str, Any]:
        """`summary_by_device` as the original kept it: the mean of each GPU's readings over the frames."""
        out: dict[str, Any] = {}
        for i, (us, un, ms, mn) in self.sums.items():
            entry = out.setdefault(i, {})
            if un:
                entry["avg_gpu_util"] = round(us / un, 2)
            if mn:
                entry["avg_gpu_memory"] = round(ms / mn, 2)
        return out


def _gpu_key(gid: str) -> tuple[str, int, str, str]:
    host, index, name = split_gpu_id(gid)
    return (host, index, "", name) if isinstance(index, int) else (host, 1 << 30, str(index), name)


def _sum_gb(rx: float | None, tx: float | None) -> float | None:
    if rx is None and tx is None:
        return None
    return round(((rx or 0.0) + (tx or 0.0)) / GB, 2)


def to_original(
    head: dict[str, Any], frames: Iterable[dict], period_s: float, bandwidth: bool, nvlink: bool
) -> dict[str, Any]:
    """A whole original document from gswarm frames (a long session goes through `ToOriginal` piece by piece)."""
    conv = ToOriginal(period_s, bandwidth, nvlink)
    out: list[dict[str, Any]] = []
    for f in frames:
        out.extend(conv.add(f))
    out.extend(conv.finish())
    return {**original_head(head), "frames": out, "summary_by_device": conv.summary()}


def original_head(head: dict[str, Any]) -> dict[str, Any]:
    """`session_name`, `start_time`, `end_time` of an export's head, times as the original wrote them."""

    def t(v: Any) -> str | None:
        return None if v is None else iso(epoch(v))

    return {"session_name": head.get("session_name"), "start_time": t(head.get("start_time")),
            "end_time": t(head.get("end_time"))}  # fmt: skip


def is_original(doc: dict[str, Any]) -> bool:
    """An original document: its frames list a time's GPUs in arrays."""
    frames = doc.get("frames")
    return (
        isinstance(frames, list)
        and bool(frames)
        and isinstance(frames[0], dict)
        and isinstance(frames[0].get("gpu_id"), list)
    )


def _at(frame: dict[str, Any], key: str, i: int) -> float | None:
    values = frame.get(key)
    return _num(values[i]) if isinstance(values, list) and i < len(values) else None


def _reading(frame: dict[str, Any], i: int) -> tuple[str, dict[str, Any]]:
    host, index, name = split_gpu_id(str(frame["gpu_id"][i]))
    g: dict[str, Any] = {"index": index, "name": name}
    for key, field in (("gpu_util", "utilization_percent"), ("gpu_memory", "memory_percent")):
        if (v := _at(frame, key, i)) is not None:
            g[field] = v
    rx, tx, total = (_at(frame, k, i) for k in ("dram_bandwidth_rx", "dram_bandwidth_tx", "dram_bandwidth"))
    if rx is None and tx is None and total is not None:
        rx, tx = total, 0.0  # only the sum was kept: rx + tx stays the same
    for field, v in (("pcie_rx_bytes_per_s", rx), ("pcie_tx_bytes_per_s", tx)):
        if v is not None:
            g[field] = round(v * GB)
    if (
        nv := _at(frame, "gpu_bandwidth", i)
    ) is not None:  # a list of links (the first layout) has no per-GPU value
        g["nvlink_rx_bytes_per_s"], g["nvlink_tx_bytes_per_s"] = round(nv * GB), 0
    return host, g


def from_original(frames: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """gswarm frames, one per host of each original frame, at the original frame's time."""
    for i, frame in enumerate(frames):
        if not isinstance(frame, dict) or not isinstance(frame.get("gpu_id"), list) or "time" not in frame:
            raise ValueError(f"frames[{i}]: not a frame of the original layout (time, gpu_id[], ...)")
        t = epoch(frame["time"])
        by_host: dict[str, list[dict[str, Any]]] = {}
        for j in range(len(frame["gpu_id"])):
            host, g = _reading(frame, j)
            by_host.setdefault(host, []).append(g)
        for host, gpus in by_host.items():
            yield {"node": host, "time": t, "gpus": gpus, "host": {}}


def period_of(frames: list[dict[str, Any]], default_s: float = 1.0) -> float:
    """The sampling period of original frames: the median step between their times."""
    times = [epoch(f["time"]) for f in frames[:1000] if isinstance(f, dict) and "time" in f]
    steps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    return statistics.median(steps) if steps else default_s


def saved_sessions(root: Path) -> Iterator[tuple[dict[str, Any], Path]]:
    """The sessions an original head kept under `root` (`<id>/state.json` and `<id>/frames.jsonl`)."""
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        state_file = d / "state.json"
        if not state_file.is_file():
            continue
        state = json.loads(state_file.read_text())
        if not isinstance(state, dict) or not state.get("name"):
            raise ValueError(f"{state_file}: a session state needs a `name`")
        yield state, d / "frames.jsonl"


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Frames of an original `frames.jsonl` (a line cut short by a crash mid-write is the last and is skipped)."""
    if not path.is_file():
        return
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError:
                    continue
