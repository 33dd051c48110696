"""Model services on a node: start a server process, wait until it answers, watch it, stop it.

Each service is recorded in `<storage_root>/services/<id>.json`, so a restarted node worker finds the
services it started (they run in their own session and outlive the worker) and reports the dead ones.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import requests

from ..devices import safe_name
from ..errors import TaskFailed
from .engines import ENGINE_METRICS, KEY_HEADER
from .warm_start import WarmStarter

MAX_METRICS = 1 << 20

log = logging.getLogger(__name__)


def pid_alive(pid: int | None, started: float | None = None) -> bool:
    """Whether process `pid` runs (and, with `started`, is the process that started then: pids are reused)."""
    if not pid:
        return False
    if started is not None and created(pid) not in (started, None):
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
        self.warm = WarmStarter(self.root)

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

    def find(self, model: str, device: str) -> str | None:
        """The id of the service of `model` on `device`, if this node runs one."""
        for e in self.entries():
            if e.get("kind") == "model" and e.get("model") == model and e.get("device") == device:
                return str(e["service_id"])
        return None

    def save(self, entry: dict[str, Any]) -> None:
        tmp = self.path(entry["service_id"]).with_suffix(".tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, self.path(entry["service_id"]))

    def remove(self, service_id: str) -> None:
        self.path(service_id).unlink(missing_ok=True)
        self.key_file(service_id).unlink(missing_ok=True)

    def key_file(self, service_id: str) -> Path:
        return self.root / f"{safe_name(service_id, 'service_id')}.key"

    def start(
        self,
        service_id: str,
        argv: list[str],
        host: str,
        port: int,
        meta: dict[str, Any],
        ready_timeout_s: float,
        env: dict[str, str] | None = None,
        warm: WarmStarter | None = None,
    ) -> dict[str, Any]:
        """Spawn the server (forked by `warm` when it can: a built-in server), wait until its readiness probe answers
        200, record it; on failure kill it and raise."""
        log_path = self.root / f"{service_id}.log"
        env = env if env is not None else server_env()  # never the node worker's own environment
        proc, pid = None, warm.spawn(argv[3:], env, log_path) if warm is not None else None
        if pid is None:
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env=env)  # fmt: skip
            pid = proc.pid
        entry = {
            **meta,
            "service_id": service_id,
            "pid": pid,
            "created": created(
                pid
            ),  # with the pid, the process itself: a pid given to another since is not it
            "host": host,
            "port": port,
            "argv": argv,
            "url": f"http://{host}:{port}",
            "log": str(log_path),
            "started_at": time.time(),
            "warm_start": proc is None,
        }
        self.save(entry)
        deadline = time.monotonic() + ready_timeout_s
        probe = str(entry.get("ready_path") or entry.get("health_path", "/health"))
        while time.monotonic() < deadline:
            code = proc.poll() if proc is not None else (None if pid_alive(pid) else -1)
            if code is not None:
                self.remove(service_id)
                raise TaskFailed(
                    f"service process exited with {code} before it was ready: {tail(log_path)}",
                    {"exit_code": code, "log_tail": tail(log_path)},
                )
            if check_health(entry["url"], timeout=1.0, pid=pid, path=probe)[0]:
                entry["ready_at"] = time.time()  # from now on the monitor's checks count
                self.save(entry)
                return entry
            time.sleep(0.05 if proc is None else 0.2)
        self.stop(service_id)
        raise TaskFailed(f"service did not answer {probe} within {ready_timeout_s:.0f} s: {tail(log_path)}")

    def stop(self, service_id: str, timeout_s: float = 15.0) -> bool:
        """Stop the service's whole process group; True when something was running."""
        entry = self.get(service_id)
        if entry is None:
            return False
        pid, started = int(entry["pid"]), entry.get("created")
        was_alive = pid_alive(pid, started)
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if started is not None and created(pid) not in (started, None):
                break  # the pid is another process's now: the server is long gone
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while pid_alive(pid, started) and time.monotonic() < deadline:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.05)
            if not pid_alive(pid, started):
                break
        self.remove(service_id)
        return was_alive

    def check_all(self) -> list[dict[str, Any]]:
        """Health of every recorded service: process alive and /health answering."""
        results = []
        for entry in self.entries():
            alive = pid_alive(entry.get("pid"), entry.get("created"))
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
                path = entry.get("health_path", "/health")
                healthy, message = check_health(entry["url"], timeout=5.0, pid=int(entry["pid"]), path=path)
            metrics = self.scrape(entry) if healthy and entry.get("metrics_path") else None
            item = {
                "service_id": entry["service_id"],
                "pid": entry.get("pid"),
                "port": entry.get("port"),
                "alive": alive,
                "healthy": healthy,
                "message": message,
                "checked_at": time.time(),
            }
            if metrics is not None:
                item["metrics"] = metrics  # the node keeps it in Redis; it is not part of the report
            results.append(item)
        return results

    def scrape(self, entry: dict[str, Any]) -> str | None:
        """The engine's own Prometheus metrics (its `metrics_path`, with the service's key), at most MAX_METRICS."""
        key = (self.key_file(entry["service_id"]).read_text().strip() if self.key_file(entry["service_id"]).exists()
               else None)  # fmt: skip
        headers = {KEY_HEADER: key, "Authorization": f"Bearer {key}"} if key else {}
        try:
            r = requests.get(f"{entry['url']}{entry['metrics_path']}", headers=headers, timeout=3.0)
        except requests.RequestException:
            return None
        return own_metrics(r.text) if r.status_code == 200 else None


def own_metrics(text: str) -> str:
    """The engine's own families of a /metrics text (their HELP, TYPE and samples), whole lines, at most
    MAX_METRICS: a server's generic families (process_*, python_*, http_*) say nothing of the engine, and would
    come back from every replica under names other exporters use too."""
    kept, size = [], 0
    for line in text.splitlines():
        name = (
            line.split(" ", 3)[2]
            if line.startswith(("# HELP ", "# TYPE ")) and line.count(" ") >= 2
            else line
        )
        if name.startswith(ENGINE_METRICS):
            size += len(line) + 1
            if size > MAX_METRICS:
                break
            kept.append(line)
    return "".join(f"{line}\n" for line in kept)


def created(pid: int) -> float | None:
    """The start time of process `pid` (None when it is gone already)."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def check_health(url: str, timeout: float, pid: int | None = None, path: str = "/health") -> tuple[bool, str]:
    """GET /health answers 200 (and, with `pid`, from that process when the server says its pid: on a host with
    several node workers, another's server may already hold the port this one's server failed to bind)."""
    try:
        r = requests.get(f"{url}{path}", timeout=timeout)
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


def server_env(
    gpu: int | list[int] | None = None, *, cpu: bool = False, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of a model server: none of the node worker's (no broker URL, no GSWARM_* settings, no
    tokens), only what a server needs to find its programs and stay offline, and the devices it may use (its own
    GPUs only, from device 0: several for tensor parallelism)."""
    env = {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.update(OFFLINE_ENV)
    if gpu is not None or cpu:  # a server sees its own GPUs only, or none
        gpus = [gpu] if isinstance(gpu, int) else list(gpu or [])
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env.update(extra or {})
    return env


PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


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
