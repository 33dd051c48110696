"""`gswarm profiler ...`: sessions over the fleet's frames (the original `gsprof` commands, see original/gsprof.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gswarm_tasks.settings import load_settings

from .client import ApiClient
from .profiler_files import fetch_export, read_export

console = Console(soft_wrap=True)
LAYOUT = click.Choice(["gswarm", "original"])
SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def api() -> ApiClient:
    return ApiClient.from_settings(load_settings())


def output_dir(given: str | None) -> Path:
    """Where `stop` writes `<name>.json`: --output-dir, else profiling.output_dir, else the current directory."""
    return Path(given or load_settings().profiling_output_dir or ".").expanduser()


def named_file(directory: Path, name: str) -> Path:
    """`<directory>/<name>.json`, for a session name as the API gives them (no separator, no leading dot)."""
    if not SESSION_NAME.match(name):
        raise click.ClickException(f"session name {name!r} is not a file name; give --output")
    return directory / f"{name}.json"


def write_export(
    c: ApiClient, name: str, path: Path, layout: str, overwrite: bool = True, **window: str | None
) -> None:
    try:
        counts = fetch_export(c, name, path, layout, overwrite, **window)
    except FileExistsError:
        raise click.ClickException(f"{path} exists: give --force to replace it, or --output-dir") from None
    what = (
        f"{counts['frames']} frames"
        if layout == "original"
        else (f"{counts['frames']} GPU readings, {counts['host_frames']} host readings")
    )
    console.print(f"wrote {path} ({what}, {layout} layout)")


@click.group("profiler")
def profiler() -> None:
    """GPU profiling sessions."""


@profiler.command("start")
@click.option("--name", default=None, help="Default: session_YYYYmmdd_HHMMSS (printed).")
@click.option("--freq", "freq_ms", type=int, default=None, help="Sampling period in ms (min 100).")
@click.option("--node", "nodes", multiple=True, help="Only these nodes (repeatable); default all.")
@click.option(
    "--enable-bandwidth/--no-bandwidth",
    default=None,
    help="PCIe bandwidth (default profiling.enable_bandwidth).",
)
@click.option(
    "--enable-nvlink/--no-nvlink", default=None, help="NVLink bandwidth (default profiling.enable_nvlink)."
)
def start(
    name: str | None,
    freq_ms: int | None,
    nodes: tuple[str, ...],
    enable_bandwidth: bool | None,
    enable_nvlink: bool | None,
) -> None:
    """Start a session."""
    cfg = load_settings()
    body: dict[str, Any] = {
        "nodes": list(nodes),
        "enable_bandwidth": cfg.profiling_bandwidth if enable_bandwidth is None else enable_bandwidth,
        "enable_nvlink": cfg.profiling_nvlink if enable_nvlink is None else enable_nvlink,
        "freq_ms": freq_ms or cfg.profiling_frequency_ms,
    }
    if name:
        body["name"] = name
    s = api().post("profiler/sessions", body)
    console.print(f"session {s['name']} started at {s['start_time']} ({s['freq_ms']} ms)")


@profiler.command("stop")
@click.option("--name", default=None, help="Default: every active session.")
@click.option(
    "--output-dir",
    "out_dir",
    default=None,
    help="Where <name>.json goes (default profiling.output_dir, else here).",
)
@click.option(
    "--format", "layout", type=LAYOUT, default=None, help="Layout of <name>.json (profiling.output_format)."
)
@click.option("--no-file", is_flag=True, help="Write no <name>.json here (the control plane writes its own).")
@click.option(
    "--force", is_flag=True, help="Replace a <name>.json that exists (by default the stop is refused)."
)
def stop(
    name: str | None, out_dir: str | None, layout: str | None, no_file: bool, force: bool = False
) -> None:
    """Stop a session (or all), print its summary and write <name>.json (never over a file, without --force)."""
    c = api()
    names = [name] if name else [s["name"] for s in c.get("profiler/sessions") if s["status"] == "active"]
    taken = [
        str(p)
        for n in names
        if not no_file and not force and (p := named_file(output_dir(out_dir), n)).exists()
    ]
    if taken:
        raise click.ClickException(
            f"{', '.join(taken)} exist(s): nothing was stopped; give --force to replace, or --output-dir"
        )
    for n in names:
        s = c.post(f"profiler/sessions/{n}/stop", {})
        console.print(
            f"session {n} stopped: {s['frame_count']} GPU frames, {s['host_frame_count']} host frames"
        )
        for dev, st in (s.get("summary_by_device") or {}).items():
            console.print(
                f"  {dev}: util mean {st['gpu_util']['mean']} max {st['gpu_util']['max']}, "
                f"memory mean {st['gpu_memory']['mean']}%"
            )
        if not no_file:
            fmt = layout or load_settings().profiling_output_format
            write_export(c, n, named_file(output_dir(out_dir), n), fmt, overwrite=force)


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


def _count(v: Any) -> str:
    return "-" if v is None else str(v)


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
            _count(s["frame_count"]),
            _count(s["host_frame_count"]),
        )
    console.print(table)


def _stat(st: dict[str, Any] | None, key: str) -> str:
    v = (st or {}).get(key)
    return "-" if v is None else f"{v:.1f}"


@profiler.command("report")
@click.option(
    "--name", default=None, help="One session's summary by device and node (default: every session)."
)
def report(name: str | None) -> None:
    """Summaries: of every session, or of one by device and by node."""
    c = api()
    if name is None:
        table = Table("name", "status", "start", "end", "GPU frames", "host frames", "GPUs", "mean util %")
        for s in c.get("profiler/sessions"):
            devices = s.get("summary_by_device") or {}
            means = [d["gpu_util"]["mean"] for d in devices.values() if d["gpu_util"]["mean"] is not None]
            mean = f"{sum(means) / len(means):.1f}" if means else "-"
            table.add_row(s["name"], s["status"], s["start_time"][:19], (s["end_time"] or "-")[:19],
                          _count(s["frame_count"]), _count(s["host_frame_count"]), str(len(devices)), mean)  # fmt: skip
        console.print(table)
        return
    s = c.get(f"profiler/sessions/{name}")
    console.print(f"session {s['name']} ({s['status']}): {s['start_time']} to {s['end_time'] or 'now'}")
    table = Table(
        "GPU", "samples", "util mean", "util p95", "util max", "memory mean", "memory p95", "memory max"
    )
    for dev, st in (s.get("summary_by_device") or {}).items():
        u, m = st["gpu_util"], st["gpu_memory"]
        table.add_row(dev, str(st["samples"]), _stat(u, "mean"), _stat(u, "p95"), _stat(u, "max"),
                      _stat(m, "mean"), _stat(m, "p95"), _stat(m, "max"))  # fmt: skip
    console.print(table)
    table = Table("node", "frames", "CPU mean", "CPU max", "DRAM mean %", "DRAM max %")
    for node, st in (s.get("summary_by_node") or {}).items():
        cpu, dram = st.get("cpu_percent"), st.get("dram_percent")
        table.add_row(node, str(st["frames"]), _stat(cpu, "mean"), _stat(cpu, "max"), _stat(dram, "mean"),
                      _stat(dram, "max"))  # fmt: skip
    console.print(table)


def _recover_list(c: ApiClient) -> None:
    rows = c.get("profiler/recover")
    if not rows:
        console.print("no session to recover: none is running or waiting to be sealed")
        return
    table = Table("name", "status", "started", "frames", "archived", "in streams", "needs")
    for r in rows:
        table.add_row(r["name"], r["status"], r["start_time"][:19], str(r["frames"]), str(r["archived_frames"]),
                      str(r["pending_frames"]), "; ".join(r["interrupted"]) or "-")  # fmt: skip
    console.print(table)


@profiler.command("recover")
@click.option(
    "--list", "list_", is_flag=True, help="Sessions that were running when the control plane stopped."
)
@click.option(
    "--name", "--session-id", "name", default=None, help="Only this session (ids are names in gswarm)."
)
@click.option(
    "--export", "export_to", is_flag=False, flag_value="", default=None, help="Write its frames [to F]."
)
@click.option("--format", "layout", type=LAYOUT, default="gswarm", help="Layout of the --export file.")
def recover(list_: bool, name: str | None, export_to: str | None, layout: str) -> None:
    """List sessions to recover (--list), resume one (--name) or all, or export one's frames (--export [F])."""
    c = api()
    if list_:
        _recover_list(c)
        return
    if export_to is not None:
        if not name:
            raise click.UsageError("--export needs --name (which session's frames)")
        write_export(c, name, Path(export_to) if export_to else named_file(Path("."), name), layout)
        return
    resumed = c.post("profiler/recover", {"name": name} if name else {})
    for s in resumed:
        console.print(f"resumed {s['name']} (since {s['start_time']})")
    if not resumed:
        console.print("no active session to resume")


@profiler.command("export")
@click.option("--name", required=True)
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Default: NAME.json")
@click.option("--format", "layout", type=LAYOUT, default="gswarm", help="gswarm's layout or the original's.")
@click.option("--start", default=None, help="Only from this time on (ISO 8601).")
@click.option("--end", default=None, help="Only up to this time (ISO 8601).")
def export(name: str, output: str | None, layout: str, start: str | None, end: str | None) -> None:
    """Write a session's frames and summaries as JSON (every page of it)."""
    path = Path(output) if output else named_file(Path("."), name)
    write_export(api(), name, path, layout, start=start, end=end)


@profiler.command("analyze")
@click.option(
    "--data", "data", required=True, type=click.Path(exists=True, dir_okay=False), help="An export JSON."
)
@click.option("--plot", "plot", required=True, type=click.Path(dir_okay=False), help="OUT.pdf or OUT.png")
def analyze(data: str, plot: str) -> None:
    """Summarize an exported session (gswarm's layout or the original's) and plot it (offline; no API needed)."""
    from gswarm_web.profiling.plots import render

    try:
        doc, layout = read_export(Path(data))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--data") from exc
    console.print(f"{data}: {layout} layout, {len(doc['frames'])} GPU readings")
    for dev, st in (doc.get("summary_by_device") or {}).items():
        console.print(
            f"{dev}: util mean {st['gpu_util']['mean']} p95 {st['gpu_util']['p95']} max "
            f"{st['gpu_util']['max']}; memory mean {st['gpu_memory']['mean']}%"
        )
    for node, st in (doc.get("summary_by_node") or {}).items():
        if st["cpu_percent"]["mean"] is None:
            continue
        console.print(
            f"{node}: {st['frames']} frames; cpu mean {st['cpu_percent']['mean']}% max {st['cpu_percent']['max']}%; "
            f"dram mean {st['dram_percent']['mean']}%"
        )
    fmt = "pdf" if plot.lower().endswith(".pdf") else "png"
    out, panels = render(doc, doc.get("steps") or None, fmt)
    Path(plot).write_bytes(out)
    console.print(f"wrote {plot} ({panels} panels)")
