"""A Gantt chart of a schedule: one row per GPU, steps coloured by model, loads hatched before them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def gantt(docs: list[tuple[str, dict[str, Any]]], path: str | Path, until: float | None = None) -> int:
    """Draw each (title, OUT.json document) as a panel, one above the other on one time axis, into `path`
    (PNG, PDF or SVG by suffix); `until` cuts the time axis. Returns the number of panels."""
    import matplotlib

    matplotlib.use("Agg")  # servers have no display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    models = sorted({e["model_name"] for _, doc in docs for e in doc["executions"]})
    cmap = plt.get_cmap("tab10" if len(models) <= 10 else "tab20")
    colour = {m: cmap(i % cmap.N) for i, m in enumerate(models)}
    gpus = max((max(e["gpus"]) for _, doc in docs for e in doc["executions"]), default=0) + 1
    height = 1.0 + (0.9 + 0.32 * gpus) * len(docs)
    fig, axes = plt.subplots(len(docs), 1, figsize=(12, height), squeeze=False)
    for ax, (title, doc) in zip((row[0] for row in axes), docs, strict=True):
        _panel(ax, title, doc, colour, gpus, until)
    handles = [Patch(facecolor=colour[m], label=m) for m in models]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="load"))
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 6), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / height))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return len(docs)


def _panel(
    ax: Any, title: str, doc: dict[str, Any], colour: dict[str, Any], gpus: int, until: float | None
) -> None:
    runs: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    loads: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in doc["executions"]:
        if until is not None and e["start_time"] - e["switch_time"] > until:
            continue
        for g in e["gpus"]:
            runs[(g, e["model_name"])].append((e["start_time"], e["end_time"] - e["start_time"]))
            if e["switch_time"] > 0:
                loads[g].append((e["start_time"] - e["switch_time"], e["switch_time"]))
    # One call per GPU and model keeps tens of thousands of steps quick to draw.
    for (g, model), spans in runs.items():
        ax.broken_barh(spans, (g - 0.4, 0.8), facecolors=colour[model], edgecolor="white", linewidth=0.3)
    for g, spans in loads.items():
        ax.broken_barh(
            spans, (g - 0.4, 0.8), facecolors="white", edgecolor="black", hatch="////", linewidth=0.3
        )
    s = doc.get("summary", {})
    ax.set_title(
        f"{title}: makespan {s.get('makespan', 0):.0f} s, {s.get('model_loads', 0)} loads, "
        f"p99 latency {s.get('request_latency_p99', 0):.0f} s",
        fontsize=10,
    )
    ax.set_yticks(range(gpus))
    ax.set_yticklabels([f"GPU {g}" for g in range(gpus)], fontsize=8)
    ax.set_ylim(gpus - 0.5, -0.5)
    ax.set_xlabel("seconds from the first request")
    if until is not None:
        ax.set_xlim(0, until)
