"""Nothing outlives its supervisor: what `gswarm up`, `host start` and `client connect` started is recorded under
GSWARM_HOME, and ended when they end, SIGKILL included.

The supervisor starts a guardian first: a small process in a session of its own that holds the read end of a pipe
whose write end only the supervisor has. When the supervisor is gone, however it went, the read returns end of file,
and the guardian ends every recorded process group (politely, then SIGKILL) and the model servers of the recorded
node (they outlive a node worker's restart, not their supervisor). A start after a crash that took the guardian too
clears the same records. Each record carries its process's start time, so a pid the system gave to another process
since is never signalled.

    python -m gswarm_web.cli.guardian --records FILE --fd N
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

RECORDS = "processes.json"  # `gswarm up` and `host start`; `client connect` keeps one per node (node_records)


def node_records(home: Path, node: str) -> Path:
    return home / f"node-{node}.processes.json"


GRACE_S = 3.0  # a polite stop's budget before SIGKILL (the supervisor's own stop takes about as long)


def identity(pid: int) -> dict[str, Any]:
    """A process as a record another process can check later: its pid and start time."""
    return {"pid": pid, "created": psutil.Process(pid).create_time()}


def same(record: dict[str, Any]) -> bool | None:
    """True: the recorded process runs; False: its pid is another process's now; None: gone."""
    try:
        proc = psutil.Process(int(record["pid"]))
        if proc.create_time() != record.get("created"):
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return None


def signal_group(record: dict[str, Any], sig: int) -> bool:
    """Signal the process group the recorded process leads; False when nothing of it is left.

    A group outlives its leader while its members run (a Celery worker's pool), and Linux gives no new process the
    number of a group that still has members: when the leader is gone, a group of that number is still its own."""
    if same(record) is False:
        return False
    try:
        os.killpg(int(record["pid"]), sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, path)


def supervisor_alive(path: Path) -> dict[str, Any] | None:
    """The record of the supervisor that wrote `path`, when it still runs."""
    sup = read(path).get("supervisor")
    return sup if isinstance(sup, dict) and same(sup) else None


def model_servers(storage_root: str | None) -> list[dict[str, Any]]:
    """The model servers a node recorded (`<storage_root>/services/*.json`) and its warm starter, as records."""
    if not storage_root:
        return []
    services = Path(storage_root) / "services"
    out = []
    for path in sorted(services.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            out.append(
                {"pid": int(entry["pid"]), "created": entry.get("created"), "name": entry["service_id"]}
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    try:  # the warm starter records its pid alone: it is the one whose command line names this node's socket
        pid = int((services / "warm-start.pid").read_text())
        proc = psutil.Process(pid)
        if str(services / "warm-start.sock") in proc.cmdline():
            out.append({"pid": pid, "created": proc.create_time(), "name": "warm-start"})
    except (OSError, ValueError, psutil.Error):
        pass
    return out


def _end(groups: list[dict[str, Any]], grace_s: float) -> None:
    alive = [g for g in groups if signal_group(g, signal.SIGTERM)]
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [g for g in alive if signal_group(g, 0)]
    for g in alive:
        signal_group(g, signal.SIGKILL)


def reap(path: Path, grace_s: float = GRACE_S) -> list[str]:
    """End everything the records in `path` name (the broker last) and drop them; the names of what ran."""
    doc = read(path)
    children = [c for c in doc.get("children", []) if isinstance(c, dict)]
    servers = [s for s in model_servers(doc.get("storage_root")) if s.get("created") is not None]
    found = [str(c.get("name")) for c in children + servers if same(c) or signal_group(c, 0)]
    _end([c for c in children if not c.get("last")] + servers, grace_s)
    _end([c for c in children if c.get("last")], grace_s)
    path.unlink(missing_ok=True)
    return found


def watch(path: Path, fd: int) -> None:
    """Block until the supervisor is gone (end of file on its pipe), then end what it left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the supervisor's to handle
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        try:
            if not os.read(fd, 64):
                break
        except InterruptedError:
            continue
    left = reap(path)
    if left:
        print(f"the supervisor is gone: ended {', '.join(left)}", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--records", required=True, type=Path, help="the supervisor's records of what it started")
    p.add_argument("--fd", required=True, type=int, help="the read end of the supervisor's lifeline")
    args = p.parse_args()
    watch(args.records, args.fd)


if __name__ == "__main__":
    main()
