"""A node worker's life: at start it learns its node, requeues what its predecessor left, and starts its file
server, service monitor, heartbeat and sampler; a task that dies with its process is reported; at shutdown all
of it stops and the node says it is offline."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from billiard.exceptions import WorkerLostError
from celery.exceptions import TimeLimitExceeded
from celery.signals import celeryd_after_setup, task_failure, worker_ready, worker_shutdown

from .. import names
from ..celery_app import settings_of
from ..context import FILE_PORT_FILE, NodeContext, current_node, set_node
from ..devices import NODE_NAME_RE, RESERVED_NODE_NAMES
from ..errors import ResourceUnavailable, TaskFailed
from ..profiling.sampler import Sampler
from ..profiling.spill import FrameSpill
from ..reporting import redis_of, report
from ..serving.engines import presets
from ..serving.installed import Detected
from ..serving.replicas import ServiceMonitor, ServiceRegistry
from ..settings import Settings
from ..transfer.server import FileServer
from ..transfer.tokens import transfer_secret
from .heartbeat import Heartbeat, route_address
from .recovery import restore_orphans

log = logging.getLogger(__name__)


@dataclass
class _Threads:
    """What a node worker runs beside its tasks, started when it is ready and stopped at shutdown."""

    started_at: float = 0.0
    file_server: FileServer | None = None
    monitor: ServiceMonitor | None = None
    heartbeat: Heartbeat | None = None
    sampler: Sampler | None = None


_threads = _Threads()


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
    _threads.started_at = time.time()
    app = instance.app
    settings = settings_of(app)
    queues = sorted(app.amqp.queues.consume_from or app.amqp.queues)
    name = resolve_node_name(settings.node_name, sender, queues)
    if name is None:
        return
    node = NodeContext.create(
        settings,
        name,
        sender,
        settings.node_address or route_address(settings.effective_redis_url),
        ServiceRegistry,
    )
    try:  # the dram tier exists only where its tmpfs does, private to this user; it is reported, never faked
        node.tiers.root("dram")
    except ResourceUnavailable as exc:
        log.warning("no dram tier: %s", exc.message)
    set_node(node)
    log.info("node worker %s serves node %s (storage %s)", sender, name, node.storage_root)


@worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    node = current_node()
    if node is None or _threads.heartbeat is not None:
        return
    settings = settings_of(sender.app)
    try:
        restore_orphans(sender.app, node.name, _threads.started_at)
    except Exception as exc:  # recovery is best effort; the visibility timeout remains the backstop
        log.warning("could not requeue orphaned tasks of %s: %s", node.name, exc)
    client = redis.Redis.from_url(settings.effective_redis_url, socket_timeout=5, socket_connect_timeout=5)
    roots = {"disk": node.storage_root}
    if node.dram_available():
        roots["dram"] = node.dram_root
    _threads.file_server = _start_file_server(
        node, roots, client, settings.file_host or node.address, settings
    )
    node.file_port = _threads.file_server.port
    log.info("file server of %s on %s:%s", node.name, settings.file_host or node.address, node.file_port)

    def on_checked(services: list[dict[str, Any]]) -> None:
        scraped = {s["service_id"]: s.pop("metrics") for s in services if "metrics" in s}
        if scraped:  # the engines' own metrics, for the control plane's /metrics (control/engine_metrics.py)
            at = time.time()
            docs = {
                sid: json.dumps({"at": at, "node": node.name, "text": text}) for sid, text in scraped.items()
            }
            client.hset(names.ENGINE_METRICS_KEY, mapping=docs)
        report(client, names.REPORT_SERVICES, node.name, "health", {"services": services})

    _threads.monitor = ServiceMonitor(node.services, settings.serve_check_interval_s, on_checked)
    _threads.monitor.start()
    sampler = _threads.sampler = Sampler(
        redis.Redis.from_url(settings.effective_redis_url, socket_timeout=2, socket_connect_timeout=2),
        node.name,
        settings.profiling_frequency_ms / 1000,
        bandwidth=settings.profiling_bandwidth,
        nvlink=settings.profiling_nvlink,
        spill=FrameSpill(node.storage_root, settings.profiling_spill_max_bytes),
        maxlen=settings.profiling_stream_max_frames,
    )
    sampler.start()
    extra = {"worker": node.worker, "queues": [node.name], "file_port": node.file_port,
             "allow_remote_code": settings.allow_remote_code}  # fmt: skip
    engines = Detected(presets(settings.serve_engines), settings.serve_engine_paths).start()

    def stats() -> dict[str, Any]:
        found = {"frames_dropped": sampler.frames_dropped}
        return found if engines.found is None else {**found, "engines": engines.found}

    _threads.heartbeat = Heartbeat(
        client,
        node.name,
        node.storage_root,
        node.dram_root,
        node.address,
        settings.heartbeat_interval_s,
        extra,
        stats=stats,
    )
    _threads.heartbeat.start()


def _start_file_server(
    node: NodeContext, roots: dict[str, Path], client: redis.Redis, host: str, settings: Settings
) -> FileServer:
    """Bind the configured port, else the one this node used last time (copies in flight know it), else any."""
    remembered = node.storage_root / FILE_PORT_FILE
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
    error = {"error": TaskFailed(repr(exception)).to_dict()}
    try:
        if sender.name == names.WORKFLOW_STEP:
            ref: dict[str, Any] = (args or [None])[0] or (kwargs or {}).get("spec") or {}
            client = redis_of(sender)
            report(client, names.REPORT_STEP, ref["task_id"], "failed", error, workflow_id=ref["workflow_id"])
            # the message may have died in a later step of its chain that it ran itself (workflows/inline.py)
            running = client.get(names.inline_step_key(str(task_id))) if task_id else None
            if running:
                ref = json.loads(running)
                report(
                    client, names.REPORT_STEP, ref["task_id"], "failed", error, workflow_id=ref["workflow_id"]
                )
        elif (kwargs or {}).get("op_id"):
            report(redis_of(sender), names.REPORT_OPERATION, kwargs["op_id"], "failed", error)
    except Exception as exc:
        log.warning("could not report the failure of %s: %s", task_id, exc)


@worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    if _threads.sampler is not None:
        _threads.sampler.stop()
    if _threads.monitor is not None:
        _threads.monitor.stop()
    if _threads.file_server is not None:
        _threads.file_server.stop()
    if _threads.heartbeat is not None:
        _threads.heartbeat.stop(announce=True)
    _threads.sampler = _threads.monitor = _threads.file_server = _threads.heartbeat = None
