"""`gswarm data ...`: the data pool's commands, over the API."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import click
import requests
from rich.console import Console
from rich.table import Column, Table

from gswarm_tasks import names
from gswarm_tasks.devices import Device, validate_node_name
from gswarm_tasks.errors import InvalidRequest, NetworkError
from gswarm_tasks.settings import load_settings

from .client import ApiClient, ApiError
from .local import device_arg, is_bare_tier, local_node
from .model import follow

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

TYPES = ("input", "output", "intermediate")
TERMINAL = ("succeeded", "failed", "cancelled")
# what the API adds to a chunk's metadata; the rest is the user's own
STANDARD_META = (
    "created_by",
    "created_at",
    "last_accessed",
    "access_count",
    "checksum",
    "blake3",
    "format",
    "size",
)


def api() -> ApiClient:
    return ApiClient.from_settings(load_settings())


def size_text(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def wait_task(c: ApiClient, task_id: str, title: str, wait: bool, quiet: bool = False) -> dict[str, Any]:
    """Follow a task (progress bar, then one line) or, when `quiet` (for --json), poll it silently; exit 1 when it
    failed or was cancelled."""
    task: dict[str, Any] = c.get(f"queue/tasks/{task_id}")
    if not quiet:
        task = follow(c, task, title, wait)
    else:
        while wait and task["status"] not in TERMINAL:
            time.sleep(0.5)
            task = c.get(f"queue/tasks/{task_id}")
        if task["status"] == "failed":
            err = task.get("error") or {}
            err_console.print(f"[red]{task['kind']} failed:[/] [{err.get('code')}] {err.get('message')}")
    if task["status"] in ("failed", "cancelled"):
        sys.exit(1)
    return task


@click.group("data")
def data() -> None:
    """The data pool: chunks of bytes on the nodes' disk and dram tiers."""


@data.command("list")
@click.option(
    "--device", default=None, help="Only chunks with a copy on this device (NODE:TIER; a bare tier: here)."
)
@click.option("--type", "chunk_type", type=click.Choice(TYPES), default=None)
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--per-page", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
def list_chunks(device: str | None, chunk_type: str | None, page: int, per_page: int, as_json: bool) -> None:
    """List chunks, newest first."""
    settings = load_settings()
    if device is not None and is_bare_tier(device):
        here = local_node(settings)
        if here is None:
            raise click.UsageError(f"--device {device}: no node runs on this host; name it (NODE:{device})")
        device = f"{here}:{device}"
    body = ApiClient.from_settings(settings).get(
        "data", device=device, type=chunk_type, page=page, per_page=per_page
    )
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    # the whole id, never folded or cut, to paste into the other commands
    table = Table(
        Column("chunk", no_wrap=True, min_width=36),
        "type",
        "size",
        "format",
        "status",
        "locations",
        "references",
    )
    for ch in body["chunks"]:
        table.add_row(
            ch["chunk_id"],
            ch["chunk_type"],
            size_text(ch.get("size")),
            ch.get("format") or "-",
            ch["status"],
            ", ".join(loc["device"] for loc in ch["locations"]) or "-",
            ", ".join(ch["references"]) or "-",
        )
    console.print(table)
    first = (body["page"] - 1) * body["per_page"]
    shown = f"{first + 1}-{first + len(body['chunks'])}" if body["chunks"] else "none"
    console.print(f"{shown} of {body['total']} chunks (page {body['page']}, {body['per_page']} per page)")


@data.command("create")
@click.option(
    "--source", default=None, help="file:///path (under an allowed root), http(s)://... or s3://bucket/key."
)
@click.option(
    "--file",
    "file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A local file, sent inline as base64 (up to the server's data.max_inline, 16 MiB by default).",
)
@click.option("--data-b64", default=None, help="The bytes, base64-encoded.")
@click.option(
    "--device",
    default="dram",
    show_default=True,
    help="NODE:disk or NODE:dram; a bare disk or dram: this host's node, else auto:<tier> (placement chooses).",
)
@click.option("--type", "chunk_type", type=click.Choice(TYPES), default="input", show_default=True)
@click.option("--format", "fmt", default=None, help="A format label (json, jsonl, bytes, ...).")
@click.option("--metadata", default=None, help="A JSON object kept with the chunk.")
@click.option("--no-wait", is_flag=True, help="Return once the task is queued.")
@click.option("--json", "as_json", is_flag=True, help="Print the chunk as JSON (no progress output).")
def create(
    source: str | None,
    file: Path | None,
    data_b64: str | None,
    device: str,
    chunk_type: str,
    fmt: str | None,
    metadata: str | None,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Create a chunk from a source URL, a local file or base64 bytes; equal content on a device is stored once."""
    given = [
        name
        for name, v in (("--source", source), ("--file", file), ("--data-b64", data_b64))
        if v is not None
    ]
    if len(given) != 1:
        raise click.UsageError(
            "give exactly one of --source, --file and --data-b64"
            + (f" (got {', '.join(given)})" if given else "")
        )
    meta: Any = {}
    if metadata is not None:
        try:
            meta = json.loads(metadata)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--metadata") from exc
        if not isinstance(meta, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--metadata")
    settings = load_settings()
    device = str(device_arg(device, None, "--device", settings))
    body: dict[str, Any] = {"device": device, "type": chunk_type, "metadata": meta}
    if fmt is not None:
        body["format"] = fmt
    if file is not None:
        size = file.stat().st_size
        if size > settings.data_max_inline:
            raise click.UsageError(
                f"{file} is {size} bytes, over the inline limit ({settings.data_max_inline} bytes, data.max_inline); "
                "put it under an allowed root and use --source file:///..."
            )
        body["data"] = base64.b64encode(file.read_bytes()).decode()
    elif data_b64 is not None:
        body["data"] = data_b64
    else:
        body["source"] = source
    c = ApiClient.from_settings(settings)
    created = c.post("data", body)
    chunk_id = created["chunk_id"]
    shared = bool(created.get("deduplicated"))
    task = wait_task(c, created["task_id"], f"create {chunk_id[:8]}", not no_wait, quiet=as_json)
    if as_json:
        out = created if task["status"] != "succeeded" else c.get(f"data/{chunk_id}")
        click.echo(json.dumps({**out, "task_id": created["task_id"], "deduplicated": shared}, indent=2))
        return
    if task["status"] == "succeeded":
        ch = c.get(f"data/{chunk_id}")
        note = " (deduplicated: its bytes are shared with equal bytes already there)" if shared else ""
        where = ", ".join(loc["device"] for loc in ch["locations"]) or device
        console.print(f"chunk {chunk_id} on {where}: {ch['status']}, {size_text(ch.get('size'))}{note}")
    else:
        console.print(f"chunk {chunk_id} is being created on {device}")


@data.command("info")
@click.argument("chunk_id")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
def info(chunk_id: str, as_json: bool) -> None:
    """A chunk: status, size, checksums, locations, references and metadata."""
    ch = api().get(f"data/{chunk_id}")
    if as_json:
        click.echo(json.dumps(ch, indent=2))
        return
    meta = ch.get("metadata") or {}
    status = f"[bold]{ch['status']}[/]" + (f"  ({ch['status_message']})" if ch.get("status_message") else "")
    console.print(f"chunk     {ch['chunk_id']}: {status}")
    console.print(f"type      {ch['chunk_type']}    format {ch.get('format') or '-'}")
    console.print(f"size      {size_text(ch.get('size'))} ({ch.get('size')} bytes)")
    console.print(f"sha256    {meta.get('checksum') or '-'}")
    console.print(f"blake3    {meta.get('blake3') or '-'}")
    console.print(f"created   {meta.get('created_at') or '-'} by {meta.get('created_by') or '-'}")
    console.print(f"accessed  {meta.get('last_accessed') or 'never'} ({meta.get('access_count') or 0} reads)")
    console.print(f"held by   {', '.join(ch['references']) or '-'}")
    console.print("locations")
    for loc in ch["locations"]:
        console.print(f"  {loc['device']:<16} {loc['status']:<10} {loc.get('path') or ''}")
    if not ch["locations"]:
        console.print("  -")
    own = {k: v for k, v in meta.items() if k not in STANDARD_META}
    if own:
        console.print(f"metadata  {json.dumps(own)}")


def _node_or_device(target: str) -> Device:
    """`node2` (its dram) or a device like `node2:disk`."""
    try:
        return Device(validate_node_name(target, "--to"), "dram")
    except InvalidRequest:
        return Device.parse(target, field="--to")


def _copied(c: ApiClient, chunk_id: str, op: dict[str, Any], kind: str, wait: bool) -> None:
    if op.get("noop"):
        console.print(f"chunk {chunk_id} is already on {op['target_device']} (nothing to do)")
        return
    task = wait_task(c, op["task_id"], f"{kind} {chunk_id[:8]}", wait)
    if task["status"] == "succeeded":
        console.print(f"chunk {chunk_id}: {op.get('source_device')} -> {op['target_device']}")


@data.command("move")
@click.argument("chunk_id")
@click.option(
    "--to", "target", required=True, help="NODE:TIER, or a bare tier (disk, dram) on the chunk's node."
)
@click.option("--priority", type=click.Choice(names.PRIORITY_NAMES), default="normal", show_default=True)
@click.option("--no-wait", is_flag=True, help="Return once the task is queued.")
def move(chunk_id: str, target: str, priority: str, no_wait: bool) -> None:
    """Move a chunk to another tier of the same node (verified, then the source copy is removed)."""
    c = api()
    op = c.post(f"data/{chunk_id}/move", {"target_device": target, "priority": priority})
    _copied(c, chunk_id, op, "move", not no_wait)


@data.command("transfer")
@click.argument("chunk_id")
@click.option("--to", "target", required=True, help="NODE (its dram) or NODE:TIER.")
@click.option("--delete-source", is_flag=True, help="Remove the copy it came from afterwards.")
@click.option("--priority", type=click.Choice(names.PRIORITY_NAMES), default="normal", show_default=True)
@click.option("--no-wait", is_flag=True, help="Return once the task is queued.")
def transfer(chunk_id: str, target: str, delete_source: bool, priority: str, no_wait: bool) -> None:
    """Copy a chunk to another node, verified before it is recorded."""
    if target in ("disk", "dram"):
        raise click.UsageError(
            f"--to {target}: name the node (NODE or NODE:{target}); `gswarm data move` changes tier on one node"
        )
    dev = _node_or_device(target)
    body = {"target_node": dev.node, "target_device": str(dev), "delete_source": delete_source}
    c = api()
    op = c.post(f"data/{chunk_id}/transfer", {**body, "priority": priority})
    _copied(c, chunk_id, op, "transfer", not no_wait)


@data.command("delete")
@click.argument("chunk_id")
@click.option(
    "--force", is_flag=True, help="Delete it even while it is pinned or used by a running workflow."
)
def delete(chunk_id: str, force: bool) -> None:
    """Delete a chunk and every copy of it."""
    c = api()
    body = c.delete(f"data/{chunk_id}", force=str(force).lower()) or {}
    tasks = body.get("tasks") or []
    for tid in tasks:
        wait_task(c, tid, f"delete {chunk_id[:8]}", True)
    console.print(f"chunk {chunk_id} deleted" + (f" ({len(tasks)} copies removed)" if tasks else ""))


@data.command("pin")
@click.argument("chunk_id")
@click.option("--holder", default="api", show_default=True, help="Who holds the pin.")
def pin(chunk_id: str, holder: str) -> None:
    """Pin a chunk: it is neither collected nor evicted, and deleting it needs --force, until it is unpinned."""
    ch = api().post(f"data/{chunk_id}/pins", {"holder": holder})
    console.print(f"chunk {chunk_id} pinned by {holder} (held by {', '.join(ch['references'])})")


@data.command("unpin")
@click.argument("chunk_id")
@click.option("--holder", default="api", show_default=True, help="Whose pin to remove.")
def unpin(chunk_id: str, holder: str) -> None:
    """Remove one pin from a chunk."""
    ch = api().delete(f"data/{chunk_id}/pins/{quote(holder, safe='')}")
    console.print(
        f"chunk {chunk_id} unpinned by {holder} (held by {', '.join(ch['references']) or 'nobody'})"
    )


RANGE = re.compile(r"^(\d+)-(\d*)$|^-(\d+)$")


def _write(resp: requests.Response, out: IO[bytes]) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    try:
        for block in resp.iter_content(1 << 20):
            out.write(block)
            h.update(block)
            n += len(block)
    except requests.RequestException as exc:
        raise NetworkError(f"the chunk's bytes stopped after {n} bytes: {type(exc).__name__}") from exc
    out.flush()
    return n, h.hexdigest()


@data.command("get")
@click.argument("chunk_id")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Default: stdout."
)
@click.option(
    "--range", "byte_range", default=None, help="Bytes a-b (inclusive), a- (from a) or -n (the last n)."
)
def get(chunk_id: str, output: Path | None, byte_range: str | None) -> None:
    """Write a chunk's bytes (the whole chunk is checked against its sha256)."""
    m = RANGE.match(byte_range or "")
    if byte_range is not None and (m is None or (m.group(2) and int(m.group(2)) < int(m.group(1)))):
        raise click.BadParameter(f"{byte_range!r} is not a-b, a- or -n with a <= b", param_hint="--range")
    headers = {"Range": f"bytes={byte_range}"} if byte_range else None
    try:
        resp = api().stream(f"data/{chunk_id}/content", headers=headers)
    except ApiError as exc:
        if exc.status != 416:
            raise
        raise click.ClickException(f"--range {byte_range} is outside the chunk") from None
    with resp:
        if byte_range and resp.status_code != 206:
            raise click.ClickException(
                f"the server did not honour --range {byte_range} (HTTP {resp.status_code})"
            )
        want = resp.headers.get("ETag", "").strip('"')
        if output is None:
            n, digest = _write(resp, sys.stdout.buffer)
        else:
            tmp = output.with_name(f".{output.name}.{os.getpid()}.part")
            try:
                with open(tmp, "wb") as f:
                    n, digest = _write(resp, f)
                if not byte_range and re.fullmatch(r"[0-9a-f]{64}", want) and digest != want:
                    raise click.ClickException(
                        f"chunk {chunk_id}: sha256 mismatch ({digest}, expected {want})"
                    )
                os.replace(tmp, output)
            finally:
                tmp.unlink(missing_ok=True)
            err_console.print(f"wrote {n} bytes to {output}", highlight=False)
            return
    if not byte_range and re.fullmatch(r"[0-9a-f]{64}", want) and digest != want:
        raise click.ClickException(f"chunk {chunk_id}: sha256 mismatch ({digest}, expected {want})")
