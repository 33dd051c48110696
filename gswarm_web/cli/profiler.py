"""`gswarm profiler ...`: sessions over the fleet's frame streams."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gswarm_tasks.settings import load_settings

from .client import ApiClient

console = Console(soft_wrap=True)


def api() -> ApiClient:
    return ApiClient.from_settings(load_settings())


@click.group("profiler")
def profiler() -> None:
    """GPU profiling sessions."""


@profiler.command("start")
@click.option("--name", required=True)
@click.option("--freq", "freq_ms", type=int, default=None, help="Sampling period in ms (min 100).")
@click.option("--node", "nodes", multiple=True, help="Only these nodes (repeatable); default all.")
@click.option("--enable-bandwidth/--no-bandwidth", default=True)
@click.option("--enable-nvlink", is_flag=True)
def start(name: str, freq_ms: int | None, nodes: tuple[str, ...], enable_bandwidth: bool, enable_nvlink: bool) -> None:
    """Start a session."""
    body = {"name": name, "nodes": list(nodes), "enable_bandwidth": enable_bandwidth, "enable_nvlink": enable_nvlink}
    body["freq_ms"] = freq_ms or load_settings().profiling_frequency_ms
    s = api().post("profiler/sessions", body)
    console.print(f"session {s['name']} started at {s['start_time']} ({s['freq_ms']} ms)")


@profiler.command("stop")
@click.option("--name", default=None, help="Default: every active session.")
def stop(name: str | None) -> None:
    """Stop a session (or all) and print its summary."""
    c = api()
    names = [name] if name else [s["name"] for s in c.get("profiler/sessions") if s["status"] == "active"]
    for n in names:
        s = c.post(f"profiler/sessions/{n}/stop", {})
        console.print(f"session {n} stopped: {s['frame_count']} GPU frames, {s['host_frame_count']} host frames")
        for dev, st in (s.get("summary_by_device") or {}).items():
            console.print(
                f"  {dev}: util mean {st['gpu_util']['mean']} max {st['gpu_util']['max']}, "
                f"memory mean {st['gpu_memory']['mean']}%"
            )


@profiler.command("status")
def status() -> None:
    """Active sessions and the newest frame of each node."""
    c = api()
    active = [s for s in c.get("profiler/sessions") if s["status"] == "active"]
    console.print(f"{len(active)} active session(s): {', '.join(s['name'] for s in active) or '-'}")
    table = Table("node", "age", "GPUs", "mean util %", "CPU %")
    for node, f in c.get("metrics/latest")["nodes"].items():
        gpus = f.get("gpus") or []
        util = [g["utilization_percent"] for g in gpus if g.get("utilization_percent") is not None]
        table.add_row(
            node,
            f"{f['age_s']:.1f}s",
            str(len(gpus)),
            f"{sum(util) / len(util):.1f}" if util else "-",
            str((f.get("host") or {}).get("cpu_percent")),
        )
    console.print(table)


@profiler.command("sessions")
def sessions() -> None:
    """Every session."""
    table = Table("name", "status", "freq ms", "nodes", "start", "end", "GPU frames", "host frames")
    for s in api().get("profiler/sessions"):
        table.add_row(
            s["name"],
            s["status"],
            str(s["freq_ms"]),
            ",".join(s["nodes"]) or "all",
            s["start_time"][:19],
            (s["end_time"] or "-")[:19],
            str(s["frame_count"] if s["frame_count"] is not None else "-"),
            str(s["host_frame_count"] if s["host_frame_count"] is not None else "-"),
        )
    console.print(table)


@profiler.command("recover")
def recover() -> None:
    """List the active sessions and publish them to the nodes again."""
    for s in api().post("profiler/recover", {}):
        console.print(f"resumed {s['name']} (since {s['start_time']})")


@profiler.command("export")
@click.option("--name", required=True)
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Default: NAME.json")
def export(name: str, output: str | None) -> None:
    """Write a session's frames and summaries as JSON."""
    doc = api().get(f"profiler/sessions/{name}/export")
    path = Path(output or f"{name}.json")
    path.write_text(json.dumps(doc))
    console.print(
        f"wrote {path} ({len(doc['frames'])} GPU readings, {len(doc.get('host_frames') or [])} host readings)"
    )


@profiler.command("analyze")
@click.option("--data", "data", required=True, type=click.Path(exists=True, dir_okay=False), help="An export JSON.")
@click.option("--plot", "plot", required=True, type=click.Path(dir_okay=False), help="OUT.pdf or OUT.png")
def analyze(data: str, plot: str) -> None:
    """Summarize an exported session and plot it (offline; no API needed)."""
    from gswarm_web.plots import render

    doc = json.loads(Path(data).read_text())
    for dev, st in (doc.get("summary_by_device") or {}).items():
        console.print(
            f"{dev}: util mean {st['gpu_util']['mean']} p95 {st['gpu_util']['p95']} max "
            f"{st['gpu_util']['max']}; memory mean {st['gpu_memory']['mean']}%"
        )
    for node, st in (doc.get("summary_by_node") or {}).items():
        console.print(
            f"{node}: {st['frames']} frames; cpu mean {st['cpu_percent']['mean']}% max {st['cpu_percent']['max']}%; "
            f"dram mean {st['dram_percent']['mean']}%"
        )
    fmt = "pdf" if plot.lower().endswith(".pdf") else "png"
    out, panels = render(doc, doc.get("steps") or None, fmt)
    Path(plot).write_bytes(out)
    console.print(f"wrote {plot} ({panels} panels)")
