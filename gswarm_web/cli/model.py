"""`gswarm model ...`: the original's model commands, over the API."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from gswarm_tasks import names
from gswarm_tasks.devices import Device
from gswarm_tasks.errors import InvalidRequest
from gswarm_tasks.settings import load_settings

from .client import ApiClient

console = Console(soft_wrap=True)


def api() -> ApiClient:
    return ApiClient.from_settings(load_settings())


def full_device(value: str | None, node: str | None, what: str) -> str | None:
    """`gpu0` + `--node node1` -> `node1:gpu0`; a full `node1:gpu0` is kept as it is."""
    if value is None:
        return None
    try:
        return str(Device.parse(value, field=what, default_node=node))
    except InvalidRequest:
        if node is None:
            raise click.UsageError(f"{what} {value!r} needs --node (or write it as NODE:{value})") from None
        raise


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
            bar.update(tid, completed=p.get("done_bytes") or 0, total=p.get("total_bytes"), phase=p.get("phase"))
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
@click.option("--json", "as_json", is_flag=True)
def list_models(location: str | None, model_type: str | None, status: str | None, as_json: bool) -> None:
    """List models."""
    body = api().get("models", location=location, type=model_type, status=status, per_page=500)
    if as_json:
        click.echo(json.dumps(body, indent=2))
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


@model.command("info")
@click.argument("name")
def info(name: str) -> None:
    """Everything about a model, manifest included."""
    click.echo(json.dumps(api().get(f"models/{name}"), indent=2))


@model.command("register")
@click.argument("name")
@click.option("--type", "model_type", required=True, help="llm, embedding, ...")
@click.option(
    "--source", "--url", "source", required=True, help="hf://org/repo[@rev], https://huggingface.co/..., file://"
)
@click.option("--trust-remote-code", is_flag=True)
@click.option("--metadata", default=None, help="JSON object.")
def register(name: str, model_type: str, source: str, trust_remote_code: bool, metadata: str | None) -> None:
    """Register a model."""
    body = {
        "model_name": name,
        "model_type": model_type,
        "source_url": source,
        "trust_remote_code": trust_remote_code,
        "metadata": json.loads(metadata) if metadata else {},
    }
    m = api().post("models", body)
    console.print(f"registered {m['model_name']} ({m['model_type']}) from {m['source_url']}")


@model.command("download")
@click.argument("name")
@click.option("--device", default="disk", show_default=True, help="disk, dram or NODE:TIER.")
@click.option("--node", default=None)
@click.option("--source", "--url", "source", default=None, help="Overrides the registered source.")
@click.option("--type", "model_type", default=None, help="Registers the model first when it is unknown.")
@click.option("--priority", default="normal", type=click.Choice(names.PRIORITY_NAMES))
@click.option("--no-wait", is_flag=True)
def download(
    name: str, device: str, node: str | None, source: str | None, model_type: str | None, priority: str, no_wait: bool
) -> None:
    """Download a model onto a node (progress bar until it is verified)."""
    c = api()
    target = full_device(device, node, "--device")
    if model_type and source:
        known = c.get("models", per_page=500)["models"]
        if name not in {m["model_name"] for m in known}:
            c.post("models", {"model_name": name, "model_type": model_type, "source_url": source})
    body = {"target_device": target, "priority": priority}
    if source:
        body["source_url"] = source
    follow(c, c.post(f"models/{name}/download", body), f"download {name}", not no_wait)


def _move(name: str, src: str, dst: str, node: str | None, kind: str, extra: dict[str, Any], wait: bool) -> None:
    c = api()
    body = {"source_device": full_device(src, node, "--from"), "target_device": full_device(dst, node, "--to"), **extra}
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


@model.command("delete")
@click.argument("name")
@click.option("--device", default=None, help="Delete one copy; without it the model and every copy go.")
@click.option("--node", default=None)
@click.option("--force", is_flag=True, help="Stop its services first.")
def delete(name: str, device: str | None, node: str | None, force: bool) -> None:
    """Delete a model's copy on one device, or the whole model."""
    c = api()
    dev = full_device(device, node, "--device")
    if dev:
        follow(c, c.delete(f"models/{name}/locations/{dev}"), f"delete {name}")
        return
    tasks = c.request("DELETE", f"models/{name}", params={"force": str(force).lower()}) or []
    for t in tasks:
        follow(c, t, f"{t['kind']} {name}")
    console.print(f"{name} deleted" if not tasks else f"{name}: {len(tasks)} task(s) done")


@model.command("serve")
@click.argument("name")
@click.option(
    "--device", default="auto", show_default=True, help="auto, auto:gpu, auto:cpu, gpuN or cpu (--node), NODE:gpuN."
)
@click.option("--replicas", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--node", default=None)
@click.option("--port", type=int, default=None)
@click.option("--backend", type=click.Choice(["builtin", "command"]), default="builtin")
@click.option("--command", "command", default=None, help="Template for the command backend.")
@click.option("--idle-timeout", type=float, default=None, help="Seconds without requests before it is unloaded.")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds to wait for the replicas.")
@click.option("--no-wait", is_flag=True)
def serve(
    name: str,
    device: str,
    replicas: int,
    node: str | None,
    port: int | None,
    backend: str,
    command: str | None,
    idle_timeout: float | None,
    timeout: float,
    no_wait: bool,
) -> None:
    """Serve a model (N replicas behind the gateway) and wait until they answer."""
    c = api()
    config: dict[str, Any] = {"backend": backend}
    if command:
        config["command"] = command
    target = device if device.startswith("auto") else full_device(device, node, "--device")
    body: dict[str, Any] = {"model_name": name, "device": target, "config": config, "replicas": replicas}
    if port:
        body["port"] = port
    if idle_timeout:
        body["idle_timeout_s"] = idle_timeout
    svc = c.post("services", body)
    for r in svc["instances"]:
        chosen = (r.get("placement") or {}).get("loaded_from")
        console.print(f"replica {r['id'][:8]} -> {r['device']}" + (f" (weights from {chosen})" if chosen else ""))
    if not no_wait:
        svc = wait_replicas(c, svc["id"], replicas, timeout)
    console.print(
        f"service {svc['id']} ({svc['ready_replicas']}/{svc['replicas']} ready, {svc['status']}): "
        f"{c.base_url}/v1 model={svc['gateway_model']}"
    )


def wait_replicas(c: ApiClient, service_id: str, count: int, timeout: float) -> dict[str, Any]:
    """Poll a service until `count` replicas run; exit 1 when it fails or the wait runs out."""
    deadline = time.monotonic() + timeout
    with console.status(f"waiting for {count} replica(s)") as status:
        while True:
            svc = c.get(f"services/{service_id}")
            status.update(f"{svc['ready_replicas']}/{count} replica(s) running ({svc['status']})")
            if svc["ready_replicas"] >= count and svc["status"] == "running":
                return svc
            if svc["status"] in ("failed", "stopped") or time.monotonic() > deadline:
                console.print(f"[red]service {service_id} {svc['status']}[/]: {svc.get('status_message') or ''}")
                sys.exit(1)
            time.sleep(0.5)


def live_service(c: ApiClient, name: str) -> dict[str, Any]:
    found = [
        s
        for s in c.get("services", per_page=500)["services"]
        if name in (s["id"], s["model_name"]) and s["status"] not in ("stopping", "stopped", "failed")
    ]
    if len(found) != 1:
        what = "no live service" if not found else f"{len(found)} live services (name one by id)"
        raise click.ClickException(f"{what} of {name}")
    return found[0]


@model.command("scale")
@click.argument("name_or_service")
@click.argument("replicas", type=click.IntRange(1, 64))
@click.option("--timeout", type=float, default=600, show_default=True)
@click.option("--no-wait", is_flag=True)
def scale(name_or_service: str, replicas: int, timeout: float, no_wait: bool) -> None:
    """Keep a model's service at REPLICAS replicas (placement chooses where new ones go)."""
    c = api()
    svc = c.request("PATCH", f"services/{live_service(c, name_or_service)['id']}", json={"replicas": replicas})
    if not no_wait:
        svc = wait_replicas(c, svc["id"], replicas, timeout)
    console.print(f"service {svc['id']}: {svc['ready_replicas']}/{svc['replicas']} replicas running")


@model.command("stop")
@click.argument("name_or_service")
@click.option("--device", default=None, help="Only the service on this device.")
@click.option("--node", default=None)
def stop(name_or_service: str, device: str | None, node: str | None) -> None:
    """Stop a model's services (or one service by id)."""
    c = api()
    dev = full_device(device, node, "--device")
    running = [
        s
        for s in c.get("services", per_page=500)["services"]
        if s["status"] in ("starting", "running", "unhealthy")
        and name_or_service in (s["id"], s["model_name"])
        and (dev is None or s["device"] == dev)
    ]
    if not running:
        raise click.ClickException(f"no running service of {name_or_service}")
    for s in running:
        follow(c, c.delete(f"services/{s['id']}"), f"stop {s['id'][:8]}")


@model.command("services")
@click.option("--json", "as_json", is_flag=True)
def services(as_json: bool) -> None:
    """List services."""
    body = api().get("services", per_page=500)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    table = Table("id", "model", "device", "status", "healthy", "url")
    for s in body["services"]:
        table.add_row(s["id"][:8], s["model_name"], s["device"], s["status"], str(s["healthy"]), s["url"] or "-")
    console.print(table)


@model.command("status")
@click.argument("name")
@click.option("--node", default=None, help="Only this node's copies.")
def status(name: str, node: str | None) -> None:
    """A model's status, copies and services."""
    m = api().get(f"models/{name}")
    console.print(
        f"{m['model_name']}: [bold]{m['status']}[/]" + (f"  ({m['status_message']})" if m.get("status_message") else "")
    )
    for loc in m["location_details"]:
        if node is None or loc["node"] == node:
            console.print(f"  {loc['device']:<16} {loc['status']:<8} {loc['path'] or ''}")
    for dev, url in m["services"].items():
        console.print(f"  serving on {dev}: {url}")
