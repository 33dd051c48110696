"""Worker start-up and shut-down hooks: a node worker learns its name and heartbeats."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from billiard.exceptions import WorkerLostError
from celery.exceptions import TimeLimitExceeded
from celery.signals import celeryd_after_setup, task_failure, worker_ready, worker_shutdown

from .celery_app import settings_of
from .devices import NODE_NAME_RE, RESERVED_NODE_NAMES
from .errors import TaskFailed
from .node import Heartbeat, route_address
from .profiler import Sampler
from .recovery import restore_orphans
from .serving import ServiceMonitor, ServiceRegistry
from .storage import Tiers
from .transfer import FileServer, transfer_secret

log = logging.getLogger(__name__)


@dataclass
class NodeContext:
    """What a node worker knows about itself; tasks read it through `current_node()`."""

    name: str
    storage_root: Path
    dram_root: Path
    address: str
    worker: str
    tiers: Tiers
    services: ServiceRegistry
    file_port: int | None = None


_node: NodeContext | None = None
_heartbeat: Heartbeat | None = None
_started_at = 0.0
_file_server: FileServer | None = None
_monitor: ServiceMonitor | None = None
_sampler: Sampler | None = None


def current_node() -> NodeContext | None:
    return _node


def require_node() -> NodeContext:
    if _node is None:
        raise TaskFailed("this worker is not a node worker (start it with -Q NODE -n NODE@%h)")
    return _node


def resolve_node_name(configured: str | None, worker_name: str, queues: list[str]) -> str | None:
    """The node this worker serves: the configured name, else the worker name's prefix, else its one node queue.

    A worker that consumes no queue of that name (the control worker) is not a node.
    """
    candidates = [configured] if configured else [worker_name.split("@", 1)[0]]
    node_queues = [q for q in queues if NODE_NAME_RE.match(q) and q not in RESERVED_NODE_NAMES]
    if not configured and len(node_queues) == 1:
        candidates.append(node_queues[0])
    for name in candidates:
        if name and name in node_queues:
            return name
    return None


@celeryd_after_setup.connect
def _on_setup(sender: str, instance: Any, **_: Any) -> None:
    global _node, _started_at
    _started_at = time.time()
    app = instance.app
    settings = settings_of(app)
    queues = sorted(app.amqp.queues.consume_from or app.amqp.queues)
    name = resolve_node_name(settings.node_name, sender, queues)
    if name is None:
        return
    storage_root = settings.effective_storage_root(name)
    dram_root = settings.effective_dram_root(name)
    _node = NodeContext(
        name=name,
        storage_root=storage_root,
        dram_root=dram_root,
        address=settings.node_address or route_address(settings.effective_redis_url),
        worker=sender,
        tiers=Tiers(name, storage_root, dram_root),
        services=ServiceRegistry(storage_root),
    )
    _node.storage_root.mkdir(parents=True, exist_ok=True)
    try:  # the dram tier exists only where its tmpfs does; it is reported, never faked
        if _node.dram_root.parent.parent.is_dir():
            _node.dram_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("no dram tier at %s: %s", _node.dram_root, exc)
    log.info("node worker %s serves node %s (storage %s)", sender, name, _node.storage_root)


@worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    global _heartbeat, _file_server, _monitor, _sampler
    if _node is None or _heartbeat is not None:
        return
    settings = settings_of(sender.app)
    try:
        restore_orphans(sender.app, _node.name, _started_at)
    except Exception as exc:  # recovery is best effort; the visibility timeout remains the backstop
        log.warning("could not requeue orphaned tasks of %s: %s", _node.name, exc)
    client = redis.Redis.from_url(settings.effective_redis_url, socket_timeout=5, socket_connect_timeout=5)
    roots = {"disk": _node.storage_root}
    if _node.dram_root.is_dir():
        roots["dram"] = _node.dram_root
    _file_server = _start_file_server(_node, roots, client, settings.file_host or _node.address, settings)
    _node.file_port = _file_server.port
    log.info("file server of %s on %s:%s", _node.name, settings.file_host or _node.address, _file_server.port)
    _monitor = ServiceMonitor(_node.services, settings.serve_check_interval_s)
    _monitor.start()
    _heartbeat = Heartbeat(
        client,
        _node.name,
        _node.storage_root,
        _node.dram_root,
        _node.address,
        settings.heartbeat_interval_s,
        extra={"worker": _node.worker, "queues": [_node.name], "file_port": _file_server.port},
        services=_node.services.snapshot,
    )
    _heartbeat.start()
    _sampler = Sampler(
        redis.Redis.from_url(settings.effective_redis_url, socket_timeout=2, socket_connect_timeout=2),
        _node.name,
        settings.profiling_frequency_ms / 1000,
        bandwidth=settings.profiling_bandwidth,
        nvlink=settings.profiling_nvlink,
    )
    _sampler.start()


def _start_file_server(node: NodeContext, roots: dict[str, Path], client: Any, host: str, settings: Any) -> FileServer:
    """Bind the configured port, else the one this node used last time (copies in flight know it), else any."""
    remembered = node.storage_root / ".file-port"
    ports = [settings.file_port] if settings.file_port else []
    try:
        ports.append(int(remembered.read_text()))
    except (OSError, ValueError):
        pass
    ports.append(0)
    secret = lambda: transfer_secret(client, settings.transfer_secret)  # noqa: E731
    for port in ports:
        try:
            server = FileServer(node.name, roots, secret, host, port)
        except OSError:
            if port == settings.file_port and settings.file_port:
                raise
            continue
        remembered.write_text(str(server.port))
        return server.start()
    raise RuntimeError("no port for the file server")


@task_failure.connect
def _on_task_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: Any = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    """A task that died with its process (worker lost, hard time limit) cannot report itself: report it here."""
    if not isinstance(exception, WorkerLostError | TimeLimitExceeded) or sender is None:
        return
    try:
        if sender.name == "gswarm.node.workflow.step":
            from .ops import redis_of
            from .workflow_tasks import emit

            spec: dict[str, Any] = (args or [None])[0] or (kwargs or {}).get("spec") or {}
            emit(
                redis_of(sender),
                spec,
                "failed",
                error={"code": "TASK_FAILED", "message": repr(exception), "details": {}},
            )
        elif (kwargs or {}).get("op_id"):
            sender.app.send_task(
                "gswarm.control.task_event",
                args=[
                    kwargs["op_id"],
                    "failed",
                    {"error": {"code": "TASK_FAILED", "message": repr(exception), "details": {}}},
                ],
                queue="control",
            )
    except Exception as exc:
        log.warning("could not report the failure of %s: %s", task_id, exc)


@worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    global _heartbeat, _file_server, _monitor, _sampler
    if _sampler is not None:
        _sampler.stop()
        _sampler = None
    if _monitor is not None:
        _monitor.stop()
        _monitor = None
    if _file_server is not None:
        _file_server.stop()
        _file_server = None
    if _heartbeat is not None:
        _heartbeat.stop(announce=True)
        _heartbeat = None
