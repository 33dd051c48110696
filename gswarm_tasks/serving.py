"""Model services on a node: start a server process, wait until it answers, watch it, stop it.

Each service is recorded in `<storage_root>/services/<id>.json`, so a restarted node worker finds the
services it started (they run in their own session and outlive the worker) and reports the dead ones.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from .devices import safe_name
from .errors import InvalidRequest, ResourceUnavailable, TaskFailed

log = logging.getLogger(__name__)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, start: int, taken: set[int]) -> int:
    for port in range(start, start + 1000):
        if port not in taken and port_free(host, port):
            return port
    raise ResourceUnavailable(f"no free port from {start} on {host}")


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class ServiceRegistry:
    """The services this node started, as JSON files, and their health checks."""

    def __init__(self, root: Path) -> None:
        self.root = root / "services"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, service_id: str) -> Path:
        return self.root / f"{safe_name(service_id, 'service_id')}.json"

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for p in sorted(self.root.glob("*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def get(self, service_id: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.path(service_id).read_text()))
        except (OSError, ValueError):
            return None

    def save(self, entry: dict[str, Any]) -> None:
        tmp = self.path(entry["service_id"]).with_suffix(".tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, self.path(entry["service_id"]))

    def remove(self, service_id: str) -> None:
        self.path(service_id).unlink(missing_ok=True)

    def start(
        self,
        service_id: str,
        argv: list[str],
        host: str,
        port: int,
        meta: dict[str, Any],
        ready_timeout_s: float,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Spawn the server, wait until GET /health answers 200, record it; on failure kill it and raise."""
        log_path = self.root / f"{service_id}.log"
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        entry = {
            **meta,
            "service_id": service_id,
            "pid": proc.pid,
            "host": host,
            "port": port,
            "argv": argv,
            "url": f"http://{host}:{port}",
            "log": str(log_path),
            "started_at": time.time(),
        }
        self.save(entry)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.remove(service_id)
                raise TaskFailed(
                    f"service process exited with {proc.returncode} before it was ready: {tail(log_path)}",
                    {"exit_code": proc.returncode, "log_tail": tail(log_path)},
                )
            if check_health(entry["url"], timeout=1.0, pid=proc.pid)[0]:
                entry["ready_at"] = time.time()  # from now on the monitor's checks count
                self.save(entry)
                return entry
            time.sleep(0.2)
        self.stop(service_id)
        raise TaskFailed(f"service did not answer /health within {ready_timeout_s:.0f} s: {tail(log_path)}")

    def stop(self, service_id: str, timeout_s: float = 15.0) -> bool:
        """Stop the service's whole process group; True when something was running."""
        entry = self.get(service_id)
        if entry is None:
            return False
        pid = int(entry["pid"])
        was_alive = pid_alive(pid)
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while pid_alive(pid) and time.monotonic() < deadline:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.05)
            if not pid_alive(pid):
                break
        self.remove(service_id)
        return was_alive

    def check_all(self) -> list[dict[str, Any]]:
        """Health of every recorded service: process alive and /health answering."""
        results = []
        for entry in self.entries():
            alive = pid_alive(entry.get("pid"))
            # A server still starting is judged by its start task, not by a check.
            starting = "ready_at" not in entry and time.time() - float(entry.get("started_at", 0)) < 3600
            if starting:
                results.append(
                    {
                        "service_id": entry["service_id"],
                        "pid": entry.get("pid"),
                        "port": entry.get("port"),
                        "alive": alive,
                        "healthy": None,
                        "starting": True,
                        "checked_at": time.time(),
                    }
                )
                continue
            healthy, message = (False, "process is not running")
            if alive:
                healthy, message = check_health(entry["url"], timeout=5.0, pid=int(entry["pid"]))
            item = {
                "service_id": entry["service_id"],
                "pid": entry.get("pid"),
                "port": entry.get("port"),
                "alive": alive,
                "healthy": healthy,
                "message": message,
                "checked_at": time.time(),
            }
            results.append(item)
        return results


def check_health(url: str, timeout: float, pid: int | None = None) -> tuple[bool, str]:
    """GET /health answers 200 (and, with `pid`, from that process when the server says its pid: on a host with
    several node workers, another's server may already hold the port this one's server failed to bind)."""
    try:
        r = requests.get(f"{url}/health", timeout=timeout)
    except requests.RequestException as exc:
        return False, f"{type(exc).__name__}"
    if r.status_code == 200 and pid is not None:
        try:
            said = r.json().get("pid")
        except (ValueError, AttributeError):
            said = None
        if said is not None and said != pid:
            return False, f"the server on {url} is process {said}, not {pid}"
    return r.status_code == 200, f"HTTP {r.status_code}"


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace").strip()
    except OSError:
        return ""


def server_argv(
    backend: str,
    model_path: Path,
    model_name: str,
    host: str,
    port: int,
    device: str,
    config: dict[str, Any],
    command_template: str | None,
    trust_remote_code: bool,
    cpu_threads: int,
) -> list[str]:
    """The command line of a model server: the built-in one, or a configured template."""
    if backend == "builtin":
        argv = [
            sys.executable,
            "-m",
            "gswarm_tasks.model_server",
            "--model-path",
            str(model_path),
            "--model-name",
            model_name,
            "--host",
            host,
            "--port",
            str(port),
            "--device",
            device,
            "--task",
            str(config.get("task", "auto")),
        ]
        if config.get("max_batch_size"):
            argv += ["--max-batch-size", str(int(config["max_batch_size"]))]
        argv += ["--threads", str(int(config.get("threads", cpu_threads)))]
        if trust_remote_code:
            argv.append("--trust-remote-code")
        return argv
    if backend == "command":
        template = config.get("command") or command_template
        if not template:
            raise InvalidRequest("config.command: the command backend needs a template (or GSWARM_SERVE_COMMAND)")
        values = {
            "path": str(model_path),
            "port": port,
            "host": host,
            "model": model_name,
            "device": device,
            "python": sys.executable,
        }
        try:
            return [part.format(**values) for part in shlex.split(str(template))]
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidRequest(f"config.command: bad template: {exc}", {"field": "config.command"}) from exc
    raise InvalidRequest(f"config.backend: {backend!r} is not builtin or command", {"field": "config.backend"})


class ServiceMonitor:
    """Checks the node's services every `interval_s` on its own thread and hands each round's results on."""

    def __init__(
        self, registry: ServiceRegistry, interval_s: float, on_checked: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.on_checked = on_checked
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gswarm-service-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.on_checked(self.registry.check_all())
            except Exception as exc:  # a broken entry or a lost report must not stop the next round
                log.warning("service check failed: %s", exc)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
