"""A profiling session's export document (pure Python, shared by the API, the control worker and the CLI): a node's
frame slimmed to what the export reads, the session's own rate, the rows of the export (one per GPU reading, one per
host reading), summaries per device and per node from values only, and a writer that puts a document of any length
in a file without holding its rows."""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

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
BANDWIDTH = ("pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s")
GPU_FIELDS = ("index", "name", *GPU_KEYS.values(), *BANDWIDTH)


def slim(f: dict[str, Any]) -> dict[str, Any]:
    """A node's frame reduced to what the export and the summaries read (its `seq` too: gaps show as holes)."""
    host = f.get("host") or {}
    gpus = [{k: g[k] for k in GPU_FIELDS if k in g} for g in f.get("gpus") or [] if isinstance(g, dict)]
    out = {
        "time": f["time"],
        "node": f["node"],
        "host": {k: host[k] for k in HOST_KEYS if k in host},
        "gpus": gpus,
    }
    if isinstance(f.get("seq"), int):
        out["seq"] = f["seq"]
    return out


def thin(frames: Iterable[dict], period_s: float) -> Iterator[dict]:
    """A session's own rate: when an overlapping session samples faster, keep one frame per period per node
    (frames of one node in time order)."""
    last: dict[str, float] = {}
    for f in frames:
        if keep(f["time"], last.get(f["node"]), period_s):
            last[f["node"]] = f["time"]
            yield f


def keep(t: float, last_kept: float | None, period_s: float) -> bool:
    """Whether a frame at `t` is one of the session's, the node's last kept one being at `last_kept`."""
    return last_kept is None or t - last_kept >= period_s * 0.75  # tolerate scheduling jitter


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "max": None, "p95": None}
    return {"mean": round(sum(values) / len(values), 3), "max": max(values), "p95": _pct(values, 95)}


def gpu_id(node: str, g: dict[str, Any]) -> str:
    return f"{node}:{g.get('index')}:{g.get('name')}"


def gpu_row(fid: int, f: dict[str, Any], g: dict[str, Any], bandwidth: bool, nvlink: bool) -> dict[str, Any]:
    """One GPU reading as the export lists it; a field the GPU did not report is absent."""
    row: dict[str, Any] = {"frame_id": fid, "time": f["time"], "gpu_id": gpu_id(f["node"], g)}
    for out, key in GPU_KEYS.items():
        row[out] = g.get(key)
    wanted = (("pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s") if bandwidth else ()) + (
        ("nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s") if nvlink else ()
    )
    row.update({k: g[k] for k in wanted if g.get(k) is not None})
    return row


def host_row(fid: int, f: dict[str, Any]) -> dict[str, Any]:
    host = f.get("host") or {}
    row = {"frame_id": fid, "time": f["time"], "node": f["node"]}
    if isinstance(f.get("seq"), int):
        row["seq"] = f["seq"]
    row.update({k: host[k] for k in HOST_KEYS if isinstance(host.get(k), int | float)})
    return row


def rows(
    fid: int, f: dict[str, Any], bandwidth: bool, nvlink: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The export's rows of one frame: its GPU readings and its host reading."""
    return [gpu_row(fid, f, g, bandwidth, nvlink) for g in f.get("gpus") or []], host_row(fid, f)


def frames_from_rows(
    gpu_rows: Iterable[dict[str, Any]], host_rows: Iterable[dict[str, Any]]
) -> Iterator[dict]:
    """The frames an export's rows came from (a host row for every frame; its GPU rows share its `frame_id`)."""
    by_fid: dict[Any, list[dict[str, Any]]] = {}
    for r in gpu_rows:
        _node, index, name = split_gpu_id(str(r.get("gpu_id")))
        g: dict[str, Any] = {"index": index, "name": name}
        g.update({key: r[out] for out, key in GPU_KEYS.items() if r.get(out) is not None})
        g.update({k: r[k] for k in BANDWIDTH if r.get(k) is not None})
        by_fid.setdefault(r.get("frame_id"), []).append(g)
    for h in host_rows:
        f = {"time": h["time"], "node": h["node"], "host": {k: h[k] for k in HOST_KEYS if k in h}}
        f["gpus"] = by_fid.get(h.get("frame_id"), [])
        if isinstance(h.get("seq"), int):
            f["seq"] = h["seq"]
        yield f


def split_gpu_id(gid: str) -> tuple[str, Any, str]:
    """`host:index:name` -> (host, index as int when it is one, name)."""
    host, _, rest = gid.partition(":")
    index, _, name = rest.partition(":")
    return host, int(index) if index.isdigit() else index, name


class Summary:
    """Summaries per device and per node, from frames as they go by: their values only (8 bytes each)."""

    def __init__(self) -> None:
        self.devices: dict[str, dict[str, array[float]]] = {}
        self.nodes: dict[str, dict[str, array[float]]] = {}
        self.samples: dict[str, int] = {}
        self.frames: dict[str, int] = {}
        self.gpu_frames = 0

    def add(self, f: dict[str, Any]) -> None:
        node, host, gpus = f["node"], f.get("host") or {}, f.get("gpus") or []
        self.frames[node] = self.frames.get(node, 0) + 1
        values = self.nodes.setdefault(node, {k: array("d") for k in HOST_KEYS})
        for k in HOST_KEYS:
            if isinstance(host.get(k), int | float):
                values[k].append(float(host[k]))
        self.gpu_frames += bool(gpus)
        for g in gpus:
            gid = gpu_id(node, g)
            self.samples[gid] = self.samples.get(gid, 0) + 1
            readings = self.devices.setdefault(gid, {k: array("d") for k in GPU_KEYS})
            for out, key in GPU_KEYS.items():
                if isinstance(g.get(key), int | float):
                    readings[out].append(float(g[key]))

    def by_device(self) -> dict[str, Any]:
        return {
            gid: {"samples": self.samples[gid], **{k: _stats(v) for k, v in values.items()}}
            for gid, values in self.devices.items()
        }

    def by_node(self) -> dict[str, Any]:
        return {
            node: {"frames": self.frames[node], **{k: _stats(v) for k, v in values.items()}}
            for node, values in self.nodes.items()
        }

    def counts(self) -> tuple[int, int]:
        """(frames with at least one GPU reading, every frame)."""
        return self.gpu_frames, sum(self.frames.values())


def export_document(
    head: dict[str, Any], frames: Iterable[dict], bandwidth: bool, nvlink: bool, first_fid: int = 0
) -> dict[str, Any]:
    """The export shape of DESIGN.md: `head` (session_name, start_time, end_time), one row per GPU reading
    (`frames`) and per host reading (`host_frames`) in one time base, with summaries per device and per node."""
    gpu_rows: list[dict[str, Any]] = []
    host_rows: list[dict[str, Any]] = []
    summary = Summary()
    for fid, f in enumerate(frames, first_fid):
        g, h = rows(fid, f, bandwidth, nvlink)
        gpu_rows.extend(g)
        host_rows.append(h)
        summary.add(f)
    return {
        **head,
        "frames": gpu_rows,
        "host_frames": host_rows,
        "summary_by_device": summary.by_device(),
        "summary_by_node": summary.by_node(),
    }


class DocumentWriter:
    """Writes a JSON document whose lists come item by item: each list goes to a spool file of its own and the
    document is put together at `close` (renamed into place: the file is whole or absent), so no list is held."""

    def __init__(self, path: Path, head: dict[str, Any], lists: Sequence[str]) -> None:
        self.path = path
        self.head = head
        path.parent.mkdir(parents=True, exist_ok=True)
        self.spools: dict[str, IO[str]] = {k: tempfile.TemporaryFile("w+", dir=path.parent) for k in lists}
        self.counts = dict.fromkeys(lists, 0)

    def add(self, key: str, items: Iterable[Any]) -> None:
        spool = self.spools[key]
        for item in items:
            spool.write(("," if self.counts[key] else "") + json.dumps(item))
            self.counts[key] += 1

    def close(self, tail: dict[str, Any], overwrite: bool = True) -> Path:
        """Write the document; without `overwrite`, a file already at the path is kept and FileExistsError raised."""
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                out.write("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in self.head.items()))
                for i, (key, spool) in enumerate(self.spools.items()):
                    out.write(("," if i or self.head else "") + json.dumps(key) + ":[")
                    spool.seek(0)
                    while chunk := spool.read(1 << 20):
                        out.write(chunk)
                    out.write("]")
                comma = "," if tail and (self.head or self.spools) else ""
                out.write(comma + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in tail.items()) + "}")
            if overwrite:
                os.replace(tmp, self.path)
            else:
                os.link(
                    tmp, self.path
                )  # refuses an existing file: no check-then-write race with another writer
                os.unlink(tmp)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        finally:
            self.discard()
        return self.path

    def discard(self) -> None:
        for spool in self.spools.values():
            spool.close()
