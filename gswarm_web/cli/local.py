"""This host as the CLI sees it: the running `gswarm up` / `host start` (a pid file under GSWARM_HOME) and the node
`gswarm up` or `gswarm client connect` runs here, which a bare tier (`disk`, `gpu0`) means when no --node is given."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import psutil

from gswarm_tasks.devices import AUTO, TIER_RE, Device
from gswarm_tasks.settings import Settings

from . import guardian
from .broker import PASSWORD_FILE, write_private

RUN_FILE = "gswarm.pid"
NODE_FILE = "node.json"


def _me() -> dict[str, Any]:
    """This process, as a record another process can check: its pid and creation time (a reused pid differs)."""
    return {"pid": os.getpid(), "created": psutil.Process().create_time()}


def alive(record: dict[str, Any] | None) -> bool:
    """Whether the process a record names still runs (the same process, not a later one with its pid)."""
    if not record or not isinstance(record.get("pid"), int):
        return False
    try:
        proc = psutil.Process(record["pid"])
        return proc.create_time() == record.get("created") and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def refuse_second(home: Path) -> None:
    """One gswarm per GSWARM_HOME (one database, one broker password): a second start is refused, saying so; what a
    gswarm that ended without stopping its processes left (guardian and all) is ended first."""
    other = _read(home / RUN_FILE)
    if alive(other):
        assert other is not None
        raise click.ClickException(
            f"gswarm is already running under GSWARM_HOME={home} ({other.get('command')}, pid {other['pid']}); "
            "`gswarm host status` shows it, `gswarm host stop` stops it"
        )
    clear_leftovers(home / guardian.RECORDS)


def clear_leftovers(records: Path) -> list[str]:
    """End what a supervisor that is gone started and left running (`records` name them); their names."""
    if guardian.supervisor_alive(records):
        return []
    left = guardian.reap(records)
    if left:
        click.echo(
            f"ended what the last gswarm under {records.parent} left running: {', '.join(left)}", err=True
        )
    return left


def claim_run(home: Path, command: str) -> None:
    """Record this process as the gswarm of `home`; refused while another one runs there."""
    refuse_second(home)
    write_private(home / RUN_FILE, json.dumps({**_me(), "command": command, "state": "starting"}))


def update_run(home: Path, **fields: Any) -> None:
    """Add what is known once everything is up (API URL, broker, node) to this process's record."""
    path = home / RUN_FILE
    doc = _read(path) or {}
    if doc.get("pid") == os.getpid():
        write_private(path, json.dumps({**doc, **fields}))


def release_run(home: Path) -> None:
    """Remove this process's record (never another's)."""
    path = home / RUN_FILE
    doc = _read(path)
    if doc is not None and doc.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def running(home: Path) -> dict[str, Any] | None:
    """The record of the gswarm running under `home`, or None (a stale record is removed)."""
    path = home / RUN_FILE
    doc = _read(path)
    if doc is not None and not alive(doc):
        path.unlink(missing_ok=True)
        return None
    return doc


def broker_port(url: Any) -> int | None:
    """The port of a broker URL as a run's record shows it (`redis://:***@host:port/0`)."""
    try:
        return urlsplit(str(url)).port if url else None
    except ValueError:
        return None


def running_api(home: Path) -> str | None:
    """The API of the gswarm running under `home`, as this host reaches it (a wildcard bind is 127.0.0.1 here)."""
    run = running(home)
    api = run.get("api") if run else None
    if not api:
        return None
    parts = urlsplit(str(api))
    if parts.hostname in ("0.0.0.0", "::", ""):
        return f"{parts.scheme}://127.0.0.1:{parts.port}"
    return str(api).rstrip("/")


def record_node(home: Path, name: str, broker: str) -> None:
    """Say that this process runs node `name` on this host (kept across exec: the worker keeps the pid)."""
    write_private(home / NODE_FILE, json.dumps({**_me(), "name": name, "broker": broker}))


def local_node(settings: Settings) -> str | None:
    """The node this host runs: GSWARM_NODE_NAME, else the one `gswarm up` / `client connect` runs here now."""
    if settings.node_name:
        return settings.node_name
    doc = _read(Path(settings.home) / NODE_FILE)
    return str(doc["name"]) if alive(doc) and isinstance(doc, dict) and doc.get("name") else None


def is_bare_tier(value: str) -> bool:
    return bool(TIER_RE.match(value))


def auto_for(tier: str) -> str:
    """`gpu0` -> `auto:gpu`, `disk` -> `auto:disk`: placement chooses a device of that kind."""
    return f"{AUTO}:{'gpu' if tier.startswith('gpu') else tier}"


def device_arg(value: str | None, node: str | None, what: str, settings: Settings) -> str | None:
    """A device option as the original writes it: `NODE:TIER` as it is; a bare tier on --node, else on this host's
    node, else `auto:<tier>` (placement chooses); `auto...` and `address:tier` go to the API as they are."""
    if value is None or value == AUTO or value.startswith(AUTO + ":"):
        return value
    if not is_bare_tier(value):
        if node is not None and ":" not in value:
            raise click.BadParameter(f"{value!r} is not a tier (disk, dram, cpu, gpuN)", param_hint=what)
        return value
    node = node or local_node(settings)
    return str(Device.parse(value, field=what, default_node=node)) if node else auto_for(value)


def private_home(home: Path) -> None:
    """$GSWARM_HOME private to its user: 0700, and what an earlier run left there made 0700 (directories) and 0600
    (files); everything made from now on is private through the umask (077) this process and its children share."""
    os.umask(0o077)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    files = [*home.glob("gswarm.db*"), home / "token", home / PASSWORD_FILE, home / "config.yaml"]
    for d in (home / "logs", home / "redis", home / "storage"):  # a private directory hides what is below it
        if d.is_dir() and not d.is_symlink():
            os.chmod(d, 0o700)
    for d in (home / "logs", home / "redis"):
        files += list(d.glob("*")) if d.is_dir() else []
    for f in files:
        if f.is_file() and not f.is_symlink():
            os.chmod(f, 0o600)
