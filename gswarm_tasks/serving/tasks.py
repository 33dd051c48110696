"""Node tasks for model services: start a model server of a preset on this node (waiting until it answers; `auto`
chooses the preset here, by what the model is and what the node has), stop it, start the warm starter ahead of
scale-ups.

`op_serve` and `op_stop` are plain functions of the node; the Celery tasks here and the workflow's serve and
stop_serve steps call the same ones.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from .. import names
from ..celery_app import app, settings_of
from ..context import NodeContext, port_free, require_node
from ..devices import Device
from ..errors import NotFound, ResourceUnavailable
from ..models.tasks import OPTS, Op, gpu_index_available, run_task
from ..reporting import Reporter
from ..settings import Settings
from ..storage import read_manifest
from .engines import AUTO, choose, presets
from .keys import forget_key, publish_key, read_key
from .kinds import model_kind, resolve_auto
from .launch import installed, launch, prewarm

log = logging.getLogger(__name__)


def op_serve(
    node: NodeContext,
    settings: Settings,
    service_id: str,
    model: str,
    tier: str | None,
    device: str,
    port: int | None,
    backend: str,
    config: dict[str, Any],
    trust_remote_code: bool,
    gpus: list[int] | None = None,
) -> Op:
    """Start a model server from one of this node's presets (`backend` names it unless `config` does) on `device`
    and, for tensor parallelism, `gpus` of this node."""
    dev = Device.parse(device, field="device")

    def body(rep: Reporter) -> dict[str, Any]:
        existing = node.services.get(service_id)
        if existing is not None:  # a redelivered start: the service already runs
            publish_key(rep.client, existing["url"], read_key(node.services.key_file(service_id)))
            return {k: existing.get(k) for k in ("pid", "port", "url", "engine")}
        offered = presets(settings.serve_engines)
        engine, params = choose(config, offered, default=backend)
        for index in gpus or ([int(dev.gpu_index or 0)] if dev.is_gpu else []):
            gpu_index_available(Device.parse(f"{node.name}:gpu{index}", field="gpus"))
        use_tier = tier or next((t for t in ("dram", "disk") if _has_model(node, t, model)), None)
        if use_tier is None:
            raise NotFound(f"{model} has no copy on {node.name}'s disk or dram", {"model": model})
        model_dir = node.tiers.model_dir(use_tier, model)
        if engine == AUTO:
            paths = settings.serve_engine_paths
            engine = resolve_auto(model_kind(model_dir), dev.is_gpu,
                                  lambda e: e in offered and installed(offered[e], paths))  # fmt: skip
        rep.set_phase("starting")
        entry = launch(node, settings, service_id, (model, model_dir, dev, port), offered[engine], params,
                       trust_remote_code, gpus)  # fmt: skip
        publish_key(rep.client, entry["url"], entry["key"])
        result = {"pid": entry["pid"], "port": entry["port"], "url": entry["url"], "engine": engine}
        return {**result, "warm_start": bool(entry.get("warm_start")), "gpus": gpus}

    return body, None


def _has_model(node: NodeContext, tier: str, model: str) -> bool:
    try:
        return read_manifest(node.tiers.model_dir(tier, model)) is not None
    except ResourceUnavailable:
        return False


def op_stop(
    node: NodeContext, service_id: str | None, model: str | None = None, device: str | None = None
) -> Op:
    def body(rep: Reporter) -> dict[str, Any]:
        sid = service_id or node.services.find(str(model), str(device))  # a workflow names model and device
        if sid is None:
            raise NotFound(f"no service of {model} on {device}", {"model": model, "device": device})
        entry, key = node.services.get(sid), read_key(node.services.key_file(sid))
        was_running = node.services.stop(sid)
        forget_key(rep.client, (entry or {}).get("url"), key)
        rep.client.hdel(names.ENGINE_METRICS_KEY, sid)  # its engine's metrics end with it
        port = entry.get("port") if entry else None
        return {
            "service_id": sid,
            "stopped": was_running,
            "port": port,
            "port_free": port is None or port_free(node.address, port),
        }

    return body, None


@app.task(name=names.SERVICE_START, **OPTS)
def serve(
    self: Task,
    op_id: str,
    service_id: str,
    model: str,
    tier: str,
    device: str,
    port: int | None,
    backend: str,
    config: dict[str, Any],
    trust_remote_code: bool = False,
    gpus: list[int] | None = None,
) -> dict[str, Any]:
    """Start a model server on this node and wait until its readiness probe answers."""
    op = op_serve(require_node(), settings_of(self.app), service_id, model, tier, device, port, backend, config,
                  trust_remote_code, gpus)  # fmt: skip
    return run_task(self, op_id, op)


@app.task(name=names.SERVICE_STOP, **OPTS)
def stop_service(self: Task, op_id: str, service_id: str) -> dict[str, Any]:
    """Stop a model server (its whole process group) and free its port."""
    return run_task(self, op_id, op_stop(require_node(), service_id))


@app.task(name=names.SERVICE_PREWARM, **OPTS)
def prewarm_task(self: Task) -> dict[str, Any]:
    """Start this node's warm starter for built-in servers (an autoscaled service may scale onto this node)."""
    return {"started": prewarm(require_node(), settings_of(self.app))}
