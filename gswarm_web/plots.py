"""Profiling plots with matplotlib: utilization and memory per GPU over time, bandwidth, a heatmap, and
the steps of workflows that ran in the window as spans, so a user sees which step left a GPU idle."""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers
import matplotlib.pyplot as plt  # noqa: E402


def _series(frames: list[dict[str, Any]], key: str) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for f in frames:
        if f.get(key) is not None:
            out[f["gpu_id"]][0].append(f["time"])
            out[f["gpu_id"]][1].append(float(f[key]))
    return dict(out)


def render(doc: dict[str, Any], spans: list[dict[str, Any]] | None = None, fmt: str = "png") -> tuple[bytes, int]:
    """The session's figure as PNG or PDF bytes, and how many panels it has."""
    frames = doc["frames"]
    t0 = min((f["time"] for f in frames), default=0.0)
    util, mem = _series(frames, "gpu_util"), _series(frames, "gpu_memory")
    bw = {k: v for k, v in _series(frames, "pcie_rx_bytes_per_s").items() if v[1]}
    panels = ["util", "memory"] + (["bandwidth"] if bw else []) + ["heatmap"] + (["steps"] if spans else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.6 * len(panels)), sharex=False, squeeze=False)
    ax = {name: axes[i][0] for i, name in enumerate(panels)}
    for gid, (ts, vs) in sorted(util.items()):
        ax["util"].plot([t - t0 for t in ts], vs, label=gid, linewidth=1)
    ax["util"].set_ylabel("GPU utilization (%)")
    ax["util"].set_ylim(0, 100)
    for gid, (ts, vs) in sorted(mem.items()):
        ax["memory"].plot([t - t0 for t in ts], vs, label=gid, linewidth=1)
    ax["memory"].set_ylabel("GPU memory used (%)")
    ax["memory"].set_ylim(0, 100)
    if bw:
        tx = _series(frames, "pcie_tx_bytes_per_s")
        for gid, (ts, vs) in sorted(bw.items()):
            ax["bandwidth"].plot([t - t0 for t in ts], [v / 1e9 for v in vs], label=f"{gid} rx", linewidth=1)
            if gid in tx:
                ax["bandwidth"].plot(
                    [t - t0 for t in tx[gid][0]],
                    [v / 1e9 for v in tx[gid][1]],
                    linestyle="--",
                    label=f"{gid} tx",
                    linewidth=1,
                )
        ax["bandwidth"].set_ylabel("PCIe (GB/s)")
    gids = sorted(util)
    if gids:
        times = sorted({f["time"] for f in frames})
        index = {t: i for i, t in enumerate(times)}
        grid = [[float("nan")] * len(times) for _ in gids]
        for r, gid in enumerate(gids):
            for t, v in zip(*util[gid], strict=False):
                grid[r][index[t]] = v
        im = ax["heatmap"].imshow(
            grid,
            aspect="auto",
            cmap="viridis",
            vmin=0,
            vmax=100,
            interpolation="nearest",
            extent=(0, (times[-1] - t0) if len(times) > 1 else 1, len(gids) - 0.5, -0.5),
        )
        ax["heatmap"].set_yticks(range(len(gids)), gids, fontsize=7)
        fig.colorbar(im, ax=ax["heatmap"], label="utilization (%)")
    ax["heatmap"].set_ylabel("GPU")
    if spans:
        rows = sorted({s["label"] for s in spans})
        for s in spans:
            y = rows.index(s["label"])
            ax["steps"].barh(
                y,
                s["end"] - s["start"],
                left=s["start"] - t0,
                height=0.6,
                color="tab:red" if s.get("state") == "failed" else "tab:blue",
            )
        ax["steps"].set_yticks(range(len(rows)), rows, fontsize=7)
        ax["steps"].set_ylabel("workflow steps")
    for name in panels:
        ax[name].set_xlabel("time since the first frame (s)")
        ax[name].grid(alpha=0.3)
    if util:
        ax["util"].legend(fontsize=7, loc="upper right")
    start = doc.get("start_time")
    fig.suptitle(f"{doc['session_name']}" + (f"  (from {start})" if start else ""))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    plt.close(fig)
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
                "state": s.state,
            }
        )
    return out
