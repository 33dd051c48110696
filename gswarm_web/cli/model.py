"""`gswarm model ...`: the original's model commands, over the API (serving: serving.py). A bare tier (`disk`,
`gpu0`) means that tier of --node, else of the node this host runs, else `auto:<tier>`."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from gswarm_tasks import names
from gswarm_tasks.errors import ApiError
from gswarm_tasks.settings import load_settings

from .client import ApiClient
from .local import device_arg, is_bare_tier, local_node

console = Console(soft_wrap=True)


def api() -> ApiClient:
    return ApiClient.from_settings(load_settings())


def full_device(value: str | None, node: str | None, what: str) -> str | None:
    """`gpu0` + `--node node1` -> `node1:gpu0`; without --node this host's node, else `auto:gpu`; a full
    `node1:gpu0` is kept as it is."""
    return device_arg(value, node, what, load_settings())


SOURCE_KINDS = ("huggingface", "hf", "web")  # the original's `--source huggingface --url https://...`


def source_url(source: str | None, url: str | None) -> str | None:
    """The model's source from the original's two spellings: `--source URL`, or `--source huggingface --url URL`."""
    if source in SOURCE_KINDS:
        if not url:
            raise click.UsageError(
                f"--source {source} needs --url (or give the URL itself: --source hf://org/repo)"
            )
        return url
    if source and url and source != url:
        raise click.UsageError("--source and --url both name a source: give one of them")
    return source or url


def follow(c: ApiClient, task: dict[str, Any], title: str, wait: bool = True) -> dict[str, Any]:
    """Show a task's progress bar until it ends; exit 1 if it failed."""
    if not wait or task["status"] in ("succeeded", "failed"):
        return finish(task)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[phase]}"),
        console=console,
        transient=True,
    ) as bar:
        tid = bar.add_task(title, total=None, phase="queued")
        while task["status"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(0.5)
            task = c.get(f"queue/tasks/{task['task_id']}")
            p = task["progress"]
            bar.update(
                tid, completed=p.get("done_bytes") or 0, total=p.get("total_bytes"), phase=p.get("phase")
            )
    return finish(task)


def finish(task: dict[str, Any]) -> dict[str, Any]:
    if task["status"] == "failed":
        err = task.get("error") or {}
        console.print(f"[red]{task['kind']} failed:[/] [{err.get('code')}] {err.get('message')}")
        sys.exit(1)
    note = " (already there)" if (task.get("result") or {}).get("noop") else ""
    console.print(f"[green]{task['kind']} {task['status']}[/]{note}  task {task['task_id']}")
    return task


@click.group("model")
def model() -> None:
    """Models: register, download, copy, move, serve."""


@model.command("list")
@click.option("--location", default=None, help="A device, node or tier.")
@click.option("--type", "model_type", default=None)
@click.option("--status", default=None)
@click.option(
    "--verbose", "-v", is_flag=True, help="Every copy (status, path), every service, source, description."
)
@click.option("--json", "as_json", is_flag=True)
def list_models(
    location: str | None, model_type: str | None, status: str | None, verbose: bool, as_json: bool
) -> None:
    """List models."""
    c = api()
    body = c.get("models", location=location, type=model_type, status=status, per_page=500)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    if verbose:
        for m in body["models"]:
            print_model(c.get(f"models/{m['model_name']}"))
        console.print(f"{body['total']} model(s)")
        return
    table = Table("model", "type", "size", "status", "locations", "services")
    for m in body["models"]:
        size = f"{m['model_size'] / 1e9:.2f} GB" if m.get("model_size") else "-"
        table.add_row(
            m["model_name"],
            m["model_type"],
            size,
            m["status"],
            ", ".join(m["locations"]) or "-",
            ", ".join(m["services"].values()) or "-",
        )
    console.print(table)


def print_model(m: dict[str, Any]) -> None:
    """One model in full: what `list --verbose` shows of each."""
    size = f"{m['model_size'] / 1e9:.2f} GB" if m.get("model_size") else "-"
    console.print(f"[bold]{m['model_name']}[/] ({m['model_type']}, {size}): {m['status']}", highlight=False)
    desc = (m.get("metadata") or {}).get("description")
    console.print(f"  source      {m.get('source_url') or '-'}" + (f"\n  description {desc}" if desc else ""))
    for loc in m.get("location_details") or []:
        console.print(
            f"  copy        {loc['device']:<16} {loc['status']:<8} {loc.get('path') or ''}", highlight=False
        )
    for dev, url in (m.get("services") or {}).items():
        console.print(f"  serving     {dev}: {url}", highlight=False)


@model.command("info")
@click.argument("name")
def info(name: str) -> None:
    """Everything about a model, manifest included."""
    click.echo(json.dumps(api().get(f"models/{name}"), indent=2))


@model.command("register")
@click.argument("name")
@click.option("--type", "model_type", required=True, help="llm, embedding, ...")
@click.option("--source", default=None, help="hf://org/repo[@rev], https://huggingface.co/..., file://")
@click.option("--url", default=None, help="The source URL (the original's spelling of --source).")
@click.option("--desc", default=None, help="A description (kept as metadata.description).")
@click.option("--trust-remote-code", is_flag=True)
@click.option("--metadata", default=None, help="JSON object.")
def register(
    name: str,
    model_type: str,
    source: str | None,
    url: str | None,
    desc: str | None,
    trust_remote_code: bool,
    metadata: str | None,
) -> None:
    """Register a model."""
    src = source_url(source, url)
    if not src:
        raise click.UsageError("give the model's source: --source URL (or --url URL)")
    try:
        meta = json.loads(metadata) if metadata else {}
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--metadata") from exc
    if not isinstance(meta, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--metadata")
    if desc is not None:
        meta["description"] = desc
    body = {
        "model_name": name,
        "model_type": model_type,
        "source_url": src,
        "trust_remote_code": trust_remote_code,
        "metadata": meta,
    }
    m = api().post("models", body)
    console.print(f"registered {m['model_name']} ({m['model_type']}) from {m['source_url']}")


def registered(c: ApiClient, name: str) -> bool:
    try:
        c.get(f"models/{name}")
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


@model.command("download")
@click.argument("name")
@click.option("--device", default="disk", show_default=True, help="disk, dram or NODE:TIER.")
@click.option("--node", default=None, help="The node (default: this host's node, else placement chooses).")
@click.option(
    "--source", default=None, help="Overrides the registered source: a URL, or `huggingface` with --url."
)
@click.option("--url", default=None, help="The source URL (with --source huggingface).")
@click.option("--type", "model_type", default=None, help="Registers the model first when it is unknown.")
@click.option("--priority", default="normal", type=click.Choice(names.PRIORITY_NAMES))
@click.option("--no-wait", is_flag=True)
def download(
    name: str,
    device: str,
    node: str | None,
    source: str | None,
    url: str | None,
    model_type: str | None,
    priority: str,
    no_wait: bool,
) -> None:
    """Download a model onto a node (progress bar until it is verified)."""
    c = api()
    source = source_url(source, url)
    target = full_device(device, node, "--device")
    if source and not registered(c, name):
        if not model_type:
            raise click.UsageError(
                f"{name} is not registered: add --type TYPE (llm, embedding, ...) to register it from --source, "
                "or `gswarm model register` it first"
            )
        c.post("models", {"model_name": name, "model_type": model_type, "source_url": source})
    body = {"target_device": target, "priority": priority}
    if source:
        body["source_url"] = source
    follow(c, c.post(f"models/{name}/download", body), f"download {name}", not no_wait)


def _move(
    name: str, src: str, dst: str, node: str | None, kind: str, extra: dict[str, Any], wait: bool
) -> None:
    c = api()
    body = {
        "source_device": full_device(src, node, "--from"),
        "target_device": full_device(dst, node, "--to"),
        **extra,
    }
    follow(c, c.post(f"models/{name}/{kind}", body), f"{kind} {name}", wait)


@model.command("move")
@click.argument("name")
@click.option("--from", "src", required=True)
@click.option("--to", "dst", required=True)
@click.option("--node", default=None)
@click.option("--keep-source", is_flag=True)
@click.option("--no-wait", is_flag=True)
def move(name: str, src: str, dst: str, node: str | None, keep_source: bool, no_wait: bool) -> None:
    """Move a model between devices (disk, dram, gpuN; across nodes)."""
    _move(name, src, dst, node, "move", {"keep_source": keep_source}, not no_wait)


@model.command("copy")
@click.argument("name")
@click.option("--from", "src", required=True)
@click.option("--to", "dst", required=True)
@click.option("--node", default=None)
@click.option("--bandwidth-limit", type=int, default=None, help="Bytes per second.")
@click.option("--no-wait", is_flag=True)
def copy(name: str, src: str, dst: str, node: str | None, bandwidth_limit: int | None, no_wait: bool) -> None:
    """Copy a model to another device or node (progress bar until verified)."""
    extra = {"bandwidth_limit": bandwidth_limit} if bandwidth_limit else {}
    _move(name, src, dst, node, "copy", extra, not no_wait)


def copy_on(c: ApiClient, name: str, device: str | None, node: str | None) -> str | None:
    """The copy `--device` names: `NODE:TIER`, a tier of --node or this host's node, else the model's one copy on
    that tier (several: name the node)."""
    if device is None or not is_bare_tier(device) or node or local_node(load_settings()):
        return full_device(device, node, "--device")
    copies = [loc["device"] for loc in c.get(f"models/{name}")["location_details"] if loc["tier"] == device]
    if len(copies) != 1:
        have = f"copies on {', '.join(copies)}" if copies else f"no copy on a {device} tier"
        raise click.UsageError(f"--device {device}: {name} has {have}; give --node (or NODE:{device})")
    return str(copies[0])


@model.command("delete")
@click.argument("name")
@click.option("--device", default=None, help="Delete one copy; without it the model and every copy go.")
@click.option("--node", default=None)
@click.option("--force", is_flag=True, help="Stop its services first.")
def delete(name: str, device: str | None, node: str | None, force: bool) -> None:
    """Delete a model's copy on one device, or the whole model."""
    c = api()
    dev = copy_on(c, name, device, node)
    if dev:
        follow(c, c.delete(f"models/{name}/locations/{dev}"), f"delete {name}")
        return
    tasks = c.request("DELETE", f"models/{name}", params={"force": str(force).lower()}) or []
    for t in tasks:
        follow(c, t, f"{t['kind']} {name}")
    console.print(f"{name} deleted" if not tasks else f"{name}: {len(tasks)} task(s) done")


@model.command("status")
@click.argument("name")
@click.option("--node", default=None, help="Only this node's copies.")
def status(name: str, node: str | None) -> None:
    """A model's status, copies and services."""
    m = api().get(f"models/{name}")
    console.print(
        f"{m['model_name']}: [bold]{m['status']}[/]"
        + (f"  ({m['status_message']})" if m.get("status_message") else "")
    )
    for loc in m["location_details"]:
        if node is None or loc["node"] == node:
            console.print(f"  {loc['device']:<16} {loc['status']:<8} {loc['path'] or ''}")
    for dev, url in m["services"].items():
        console.print(f"  serving on {dev}: {url}")
