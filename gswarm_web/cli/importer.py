"""`gswarm import [PATH ...]`: what the original gswarm kept, brought into this one through the API.

A `~/.gswarm_model_data` directory: its `registry.json` models are registered (`POST /models`), and each stored
location on a node of the fleet is recorded once that node has verified the copy (`POST /models/{m}/locations`);
services are processes, not data: they are not imported. A `~/.gswarm_profiler_data` directory: each session
(`<id>/state.json`, `<id>/frames.jsonl`) becomes a session of the same name, its frames archived. A profiler
export file of either layout (the original's `<name>.json`, or gswarm's) becomes a session too.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from gswarm_tasks.errors import ApiError
from gswarm_tasks.settings import load_settings

from ..profiling.export import frames_from_rows, slim
from ..profiling.original import epoch, from_original, iso, period_of, read_jsonl, saved_sessions
from .client import ApiClient

console = Console(soft_wrap=True)
BATCH = 5000  # frames per request
DEFAULT_PATHS = (
    "~/.gswarm_model_data",
    "~/.gswarm_profiler_data",
    ".gswarm_model_data",
    ".gswarm_profiler_data",
)
BAD_NAME = re.compile(r"[^A-Za-z0-9_.-]")
VERIFY_TIMEOUT_S = 120.0  # a node verifying a copy it holds
DONE = ("succeeded", "failed", "cancelled")


def session_name(raw: Any) -> str:
    name = BAD_NAME.sub("_", str(raw or "imported")).lstrip("_.-")[:128]
    return name or "imported"


def _iso(t: Any) -> str | None:
    return None if t is None else iso(epoch(t))


def import_session(c: ApiClient, head: dict[str, Any], frames: Callable[[], Iterable[dict]]) -> str:
    """One session: `head` (name, start_time, end_time, freq_ms, enable_bandwidth, enable_nvlink,
    request_time_info); `frames()` gives its gswarm frames, each host's in time order (read twice: hosts, then
    frames). Returns what happened, in words."""
    nodes: set[str] = set()
    first = last = None
    for f in frames():
        nodes.add(f["node"])
        first = f["time"] if first is None else min(first, f["time"])
        last = f["time"] if last is None else max(last, f["time"])
    if first is None:
        return f"{head['name']}: no frames, not imported"
    body = {**head, "nodes": sorted(nodes)}
    body["start_time"] = _iso(head.get("start_time") or first)
    body["end_time"] = _iso(head.get("end_time") or last)
    try:
        c.post("profiler/imports", body)
    except ApiError as exc:
        if exc.status == 409:
            return f"{head['name']}: a session of that name exists, not imported"
        raise
    sent = 0
    batch: list[dict] = []
    for f in frames():
        batch.append(slim(f))
        if len(batch) >= BATCH:
            sent += c.post(f"profiler/imports/{head['name']}/frames", {"frames": batch})["frames"]
            batch = []
    if batch:
        sent += c.post(f"profiler/imports/{head['name']}/frames", {"frames": batch})["frames"]
    s = c.post(f"profiler/imports/{head['name']}/finish", {})
    return f"{s['name']}: imported, {sent} frames of {len(nodes)} host(s), {len(s['summary_by_device'] or {})} GPUs"


def _freq_ms(period_s: float) -> int:
    return max(1, round(period_s * 1000))


def original_head(name: Any, doc: dict[str, Any], frames: list[dict[str, Any]]) -> dict[str, Any]:
    first = frames[0] if frames else {}
    nvlink = isinstance(first.get("gpu_bandwidth"), list) and not any(
        isinstance(v, dict) for v in first["gpu_bandwidth"]
    )
    return {
        "name": session_name(name),
        "start_time": doc.get("start_time"),
        "end_time": doc.get("end_time"),
        "freq_ms": _freq_ms(period_of(frames)),
        "enable_bandwidth": any(k in first for k in ("dram_bandwidth", "dram_bandwidth_rx")),
        "enable_nvlink": nvlink,
        "request_time_info": [],
    }


def import_export_file(c: ApiClient, path: Path, name: str | None) -> str:
    """A profiler export of either layout."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("frames"), list):
        raise click.BadParameter(f"{path}: not a profiler export (no `frames` list)", param_hint="PATH")
    frames = doc["frames"]
    if frames and isinstance(frames[0], dict) and isinstance(frames[0].get("gpu_id"), list):
        head = original_head(name or doc.get("session_name") or path.stem, doc, frames)
        return import_session(c, head, lambda: from_original(frames))
    hosts = doc.get("host_frames") or []
    steps = [b["time"] - a["time"] for a, b in zip(hosts, hosts[1:], strict=False) if a["node"] == b["node"]]
    head = {
        "name": session_name(name or doc.get("session_name") or path.stem),
        "start_time": doc.get("start_time"),
        "end_time": doc.get("end_time"),
        "freq_ms": _freq_ms(statistics.median([s for s in steps if s > 0] or [1.0])),
        "enable_bandwidth": any("pcie_rx_bytes_per_s" in r for r in frames),
        "enable_nvlink": any("nvlink_rx_bytes_per_s" in r for r in frames),
        "request_time_info": doc.get("request_time_info") or [],
    }
    return import_session(c, head, lambda: _by_node_in_order(frames_from_rows(frames, hosts)))


def _by_node_in_order(frames: Iterable[dict]) -> Iterator[dict]:
    yield from sorted(frames, key=lambda f: (f["time"], f["node"]))


def import_profiler_data(c: ApiClient, root: Path) -> list[str]:
    """Every session an original head kept under `root`."""
    out = []
    for state, frames_file in saved_sessions(root):
        frames = list(read_jsonl(frames_file))
        head = original_head(state["name"], state, frames)
        out.append(import_session(c, head, partial(from_original, frames)))
    return out


def _models(reg: dict[str, Any]) -> list[dict[str, Any]]:
    """The registry's models, whichever shape it has (`model_status` list, or `models` by name or as a list)."""
    if isinstance(reg.get("model_status"), list):
        return [m for m in reg["model_status"] if isinstance(m, dict)]
    models = reg.get("models")
    if isinstance(models, dict):
        return [{"name": k, **v} for k, v in models.items() if isinstance(v, dict)]
    if isinstance(models, list):
        return [m for m in models if isinstance(m, dict)]
    raise click.BadParameter("registry.json: no `model_status` or `models`", param_hint="PATH")


def _model_body(m: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = m["metadata"] if isinstance(m.get("metadata"), dict) else {}
    url = m.get("source_url") or m.get("url") or meta.get("url") or meta.get("source_url")
    body: dict[str, Any] = {
        "model_name": m.get("model_name") or m.get("name"),
        "model_type": m.get("model_type") or m.get("type") or "llm",
        "source_url": url,
        "metadata": {k: v for k, v in meta.items() if k not in ("url", "source_url")},
    }
    desc = m.get("description") or m.get("desc")
    if desc:
        body["metadata"]["description"] = desc
    size = m.get("model_size") or m.get("size")
    if isinstance(size, int) and size >= 0:
        body["model_size"] = size
    return body


def import_model_data(c: ApiClient, root: Path) -> list[str]:
    """Models of an original `registry.json`, with their locations on nodes of the fleet."""
    reg = json.loads((root / "registry.json").read_text())
    fleet = {n["name"] for n in c.get("nodes", per_page=500)["nodes"]}
    out = []
    for m in _models(reg):
        body = _model_body(m)
        name = body["model_name"]
        if not body["source_url"]:
            out.append(
                f"model {name}: no source URL, not registered (`gswarm model register {name} --source URL`)"
            )
            continue
        try:
            c.post("models", body)
            out.append(f"model {name}: registered")
        except ApiError as exc:
            if exc.status != 409:
                out.append(f"model {name}: not registered: {exc.message}")
                continue
            out.append(f"model {name}: already registered")
        for loc in m.get("stored_locations") or m.get("locations") or []:
            out.append(f"  {loc}: {_location(c, name, str(loc), fleet)}")
    return out


def _location(c: ApiClient, model: str, device: str, fleet: set[str]) -> str:
    node = device.split(":", 1)[0]
    if ":" not in device or node == "web":
        return "not a stored copy, skipped"
    if node not in fleet:
        return f"node {node} is not in the fleet, not recorded"
    try:
        task = c.post(f"models/{model}/locations", {"device": device})
    except ApiError as exc:
        return f"not recorded: {exc.message}"
    deadline = time.monotonic() + VERIFY_TIMEOUT_S
    while task.get("status") not in DONE and time.monotonic() < deadline:
        time.sleep(0.5)
        task = c.get(f"queue/tasks/{task['task_id']}")
    if task.get("status") == "succeeded":
        return f"recorded ({node} verified the copy)"
    if task.get("status") not in DONE:
        return f"{node} is verifying the copy (task {task['task_id']}); it is recorded if the files match"
    error = task.get("error") or {}
    return f"not recorded: {error.get('message') or task.get('status')}"


@click.command("import")
@click.argument("paths", nargs=-1, type=click.Path(exists=True))
@click.option(
    "--name", default=None, help="Session name for a single export file (default: its session_name)."
)
def import_(paths: tuple[str, ...], name: str | None) -> None:
    """Bring in the original gswarm's data: ~/.gswarm_model_data, ~/.gswarm_profiler_data, or an export file."""
    c = ApiClient.from_settings(load_settings())
    roots = [Path(p) for p in paths] or [p for d in DEFAULT_PATHS if (p := Path(d).expanduser()).is_dir()]
    if not roots:
        raise click.UsageError(
            "nothing to import: give a PATH (no ~/.gswarm_model_data or ~/.gswarm_profiler_data)"
        )
    for root in roots:
        if root.is_file():
            lines = [import_export_file(c, root, name)]
        elif (root / "registry.json").is_file():
            lines = import_model_data(c, root)
        else:
            lines = import_profiler_data(c, root)
            if not lines:
                lines = [f"{root}: no registry.json and no saved session (<id>/state.json): nothing imported"]
        for line in lines:
            console.print(line)
