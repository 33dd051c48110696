"""Profiling plots with matplotlib: per GPU, utilization and memory over time, PCIe bandwidth and a heatmap; per
node, CPU, DRAM, disk and network; and the workflow steps that ran in the window as spans, so a user sees which
step left a GPU (or a CPU pipeline) idle. A session without GPUs gets the host panels alone."""

from __future__ import annotations

import io
import math
from collections import defaultdict
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

Series = dict[str, tuple[list[float], list[float]]]
HOST_PANELS = {
    "cpu": ("CPU (%)", (("cpu_percent", "", 1.0),)),
    "dram": ("DRAM used (%)", (("dram_percent", "", 1.0),)),
    "disk": (
        "disk (MB/s)",
        (("disk_read_bytes_per_s", " read", 1e6), ("disk_write_bytes_per_s", " write", 1e6)),
    ),
    "network": ("network (MB/s)", (("net_rx_bytes_per_s", " rx", 1e6), ("net_tx_bytes_per_s", " tx", 1e6))),
}


def _series(rows: list[dict[str, Any]], key: str, by: str) -> Series:
    out: Series = defaultdict(lambda: ([], []))
    for r in rows:
        if r.get(key) is not None:
            out[r[by]][0].append(r["time"])
            out[r[by]][1].append(float(r[key]))
    return dict(out)


def _lines(
    ax: Axes, series: Series, t0: float, scale: float = 1.0, suffix: str = "", style: str = "-"
) -> None:
    for name, (ts, vs) in sorted(series.items()):
        ax.plot([t - t0 for t in ts], [v / scale for v in vs], style, label=f"{name}{suffix}", linewidth=1)


HEATMAP_COLUMNS = 2000  # time buckets: a figure has no more pixels than that, and the grid stays small


def _heatmap(fig: Figure, ax: Axes, frames: list[dict[str, Any]], util: Series, t0: float) -> None:
    gids = sorted(util)
    first, last = min(f["time"] for f in frames), max(f["time"] for f in frames)
    cols = min(HEATMAP_COLUMNS, len({f["time"] for f in frames}))
    span = (last - first) or 1.0
    grid = [[float("nan")] * cols for _ in gids]
    for r, gid in enumerate(gids):
        for t, v in zip(*util[gid], strict=False):
            col = min(cols - 1, int((t - first) / span * cols))
            cell = grid[r][col]
            grid[r][col] = v if math.isnan(cell) else max(cell, v)  # a bucket shows its busiest reading
    im = ax.imshow(
        grid,
        aspect="auto",
        cmap="viridis",
        vmin=0,
        vmax=100,
        interpolation="nearest",
        extent=(first - t0, (last - t0) if last > first else 1, len(gids) - 0.5, -0.5),
    )
    ax.set_yticks(range(len(gids)), gids, fontsize=7)
    fig.colorbar(im, ax=ax, label="utilization (%)")
    ax.set_ylabel("GPU")


def _gpu_panels(fig: Figure, ax: dict[str, Axes], frames: list[dict[str, Any]], t0: float) -> None:
    util = _series(frames, "gpu_util", "gpu_id")
    _lines(ax["util"], util, t0)
    ax["util"].set(ylabel="GPU utilization (%)", ylim=(0, 100))
    _lines(ax["memory"], _series(frames, "gpu_memory", "gpu_id"), t0)
    ax["memory"].set(ylabel="GPU memory used (%)", ylim=(0, 100))
    if "bandwidth" in ax:
        _lines(ax["bandwidth"], _series(frames, "pcie_rx_bytes_per_s", "gpu_id"), t0, 1e9, " rx")
        _lines(ax["bandwidth"], _series(frames, "pcie_tx_bytes_per_s", "gpu_id"), t0, 1e9, " tx", "--")
        ax["bandwidth"].set_ylabel("PCIe (GB/s)")
    _heatmap(fig, ax["heatmap"], frames, util, t0)
    ax["util"].legend(fontsize=7, loc="upper right")


def _host_panels(ax: dict[str, Axes], rows: list[dict[str, Any]], t0: float) -> None:
    for panel, (label, keys) in HOST_PANELS.items():
        for i, (key, suffix, scale) in enumerate(keys):
            _lines(ax[panel], _series(rows, key, "node"), t0, scale, suffix, "-" if i == 0 else "--")
        ax[panel].set_ylabel(label)
        if ax[panel].lines:
            ax[panel].legend(fontsize=7, loc="upper right")
    for panel in ("cpu", "dram"):
        ax[panel].set_ylim(0, 100)


def _step_panel(ax: Axes, spans: list[dict[str, Any]], t0: float) -> None:
    rows = sorted({s["label"] for s in spans})
    for s in spans:
        color = "tab:red" if s.get("status", s.get("state")) == "failed" else "tab:blue"
        ax.barh(rows.index(s["label"]), s["end"] - s["start"], left=s["start"] - t0, height=0.6, color=color)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_ylabel("workflow steps")


def panels_of(doc: dict[str, Any], spans: list[dict[str, Any]] | None) -> list[str]:
    """The panels a session's figure has: the GPU ones when it has GPU readings, the host ones when it has host
    readings, and the steps when any ran in its window."""
    frames, hosts = doc["frames"], doc.get("host_frames") or []
    panels = []
    if frames:
        has_bw = any(f.get("pcie_rx_bytes_per_s") is not None for f in frames)
        panels += ["util", "memory"] + (["bandwidth"] if has_bw else []) + ["heatmap"]
    if hosts or not frames:
        panels += list(HOST_PANELS)
    return panels + (["steps"] if spans else [])


def render(
    doc: dict[str, Any], spans: list[dict[str, Any]] | None = None, fmt: str = "png"
) -> tuple[bytes, int]:
    """The session's figure as PNG or PDF bytes, and how many panels it has."""
    frames, hosts = doc["frames"], doc.get("host_frames") or []
    t0 = min((f["time"] for f in [*frames, *hosts]), default=0.0)
    panels = panels_of(doc, spans)
    fig = Figure(
        figsize=(11, 2.6 * len(panels))
    )  # not pyplot's: no global state, so threads may draw at once
    axes = fig.subplots(len(panels), 1, squeeze=False)
    ax = {name: axes[i][0] for i, name in enumerate(panels)}
    if frames:
        _gpu_panels(fig, ax, frames, t0)
    if "cpu" in ax:
        _host_panels(ax, hosts, t0)
    if spans:
        _step_panel(ax["steps"], spans, t0)
    for name in panels:
        ax[name].set_xlabel("time since the first frame (s)")
        ax[name].grid(alpha=0.3)
    start = doc.get("start_time")
    fig.suptitle(f"{doc['session_name']}" + (f"  (from {start})" if start else ""))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return buf.getvalue(), len(panels)


def step_spans(rows: list[Any], lo: datetime, hi: datetime | None) -> list[dict[str, Any]]:
    """Workflow steps that ran inside [lo, hi], as spans labelled `step @ node:device`."""
    out = []
    for s in rows:
        if s.started_at is None:
            continue
        end = s.finished_at or hi or datetime.now(s.started_at.tzinfo)
        if end < lo or (hi is not None and s.started_at > hi):
            continue
        out.append(
            {
                "label": f"{s.step_id} @ {s.device or s.node}",
                "start": s.started_at.timestamp(),
                "end": end.timestamp(),
                "status": s.state,
            }
        )
    return out
