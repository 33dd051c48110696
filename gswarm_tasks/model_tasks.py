"""Node tasks for models: download, copy (pull from a peer), move between local tiers, delete, serve, stop.

Each operation is a plain function (`op_*`) of the node, the settings and a Reporter; the Celery tasks
here and the workflow steps call the same functions. Paths come only from checked names; the control
worker records a location only after a task says the copy is in place.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable
from typing import Any

from celery import Task

from . import names
from .celery_app import NodeTask, app, settings_of
from .context import NodeContext, require_node
from .devices import Device
from .errors import InvalidRequest, NotFound, ResourceUnavailable, TaskFailed
from .nvml import list_gpus
from .reporting import Reporter, run_op
from .serving import pick_port, port_free, server_argv
from .settings import Settings
from .sources import copy_local, download_hf, parse_source, verify_against_hub
from .storage import (
    build_manifest,
    copy_tree_verified,
    install,
    manifest_digest,
    read_manifest,
    remove_tree,
    write_manifest,
)
from .transfer.client import fetch_manifest, pull_files

log = logging.getLogger(__name__)
OPTS: dict[str, Any] = {"base": NodeTask, "bind": True}
Op = tuple[Callable[[Reporter], dict[str, Any]], Callable[[], None] | None]


def _location(node: NodeContext, tier: str, model: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "device": str(node.tiers.device(tier)),
        "path": str(node.tiers.model_dir(tier, model)),
        "size_bytes": manifest["total_bytes"],
        "manifest": manifest,
    }


def op_download(node: NodeContext, settings: Settings, op_id: str, model: str, source_url: str, tier: str) -> Op:
    staging = node.tiers.staging_dir(tier, f"dl-{op_id}")

    def body(rep: Reporter) -> dict[str, Any]:
        source = parse_source(source_url, settings.allowed_roots)
        rep.set_phase("downloading")
        staging.mkdir(parents=True, exist_ok=True)
        if source.scheme == "hf":
            meta = download_hf(source, staging, rep.progress, on_total=lambda n: rep.set_phase("downloading", total=n))
        else:
            meta = copy_local(source, staging, rep.progress)
        rep.set_phase("verifying", reset=True)
        manifest = build_manifest(staging, rep.progress)
        if "expected" in meta:
            verify_against_hub(staging, manifest, meta.pop("expected"))
        manifest["source"] = {"url": source_url, **meta}
        write_manifest(staging, manifest)
        install(staging, node.tiers.model_dir(tier, model))
        return _location(node, tier, model, manifest)

    return body, lambda: shutil.rmtree(staging, ignore_errors=True)


def op_copy(
    node: NodeContext,
    settings: Settings,
    model: str,
    manifest: dict[str, Any] | None,
    target_tier: str,
    source: dict[str, Any],
    bandwidth_limit: float | None,
) -> Op:
    """Pull from a peer's file server (or copy from a local tier) into `target_tier`; resumable."""
    state: dict[str, Any] = {}

    def cleanup() -> None:
        if "staging" in state:
            shutil.rmtree(state["staging"], ignore_errors=True)

    def body(rep: Reporter) -> dict[str, Any]:
        local = source["node"] == node.name
        man = manifest
        if man is None:  # a workflow step: the manifest travels with the model, read it from the source
            man = (
                read_manifest(node.tiers.model_dir(source["tier"], model))
                if local
                else fetch_manifest(source["address"], int(source["port"]), source["token"], source["prefix"])
            )
            if man is None:
                raise NotFound(f"{model} is not on {Device(source['node'], source['tier'])}", {"model": model})
        final = node.tiers.model_dir(target_tier, model)
        existing = read_manifest(final)
        if existing is not None and manifest_digest(existing) == manifest_digest(man):
            return {**_location(node, target_tier, model, man), "noop": True, "fetched_bytes": 0}
        staging = state["staging"] = node.tiers.staging_dir(target_tier, f"cp-{model}-{manifest_digest(man)}")
        rep.set_phase("copying", total=int(man["total_bytes"]))
        fetched = int(man["total_bytes"])
        if local:
            copy_tree_verified(node.tiers.model_dir(source["tier"], model), staging, man, rep.progress)
        else:
            fetched = pull_files(
                source["address"],
                int(source["port"]),
                source["token"],
                source["prefix"],
                man,
                staging,
                streams=settings.transfer_streams,
                bandwidth_limit=bandwidth_limit,
                progress=rep.progress,
            )
        rep.set_phase("verifying")
        write_manifest(staging, man)
        install(staging, final)
        return {**_location(node, target_tier, model, man), "fetched_bytes": fetched}

    return body, cleanup


def _gpu_index_available(device: Device) -> None:
    index = device.gpu_index
    gpus = [g["index"] for g in list_gpus()]
    if index not in gpus:
        raise ResourceUnavailable(
            f"{device} is not available: this host has {'GPUs ' + str(gpus) if gpus else 'no GPU'}",
            {"device": str(device), "gpus": gpus},
        )


def op_move(
    node: NodeContext,
    settings: Settings,
    op_id: str,
    model: str,
    manifest: dict[str, Any] | None,
    source_tier: str,
    target_tier: str,
    keep_source: bool,
) -> Op:
    """Move (or copy) between tiers of this node: disk <-> dram, or load into GPU memory."""
    target = Device(node.name, target_tier)
    src_dir = node.tiers.model_dir(source_tier, model)

    def manifest_now() -> dict[str, Any]:
        man = manifest or read_manifest(src_dir)
        if man is None:
            raise NotFound(f"{model} is not on {node.tiers.device(source_tier)}", {"model": model})
        return man

    if target.is_gpu:

        def load(rep: Reporter) -> dict[str, Any]:
            _gpu_index_available(target)
            man = manifest_now()
            rep.set_phase("moving", total=int(man["total_bytes"]))
            port = pick_port(node.address, settings.serve_port_start + 1000, set())
            argv = [
                sys.executable,
                "-m",
                "gswarm_tasks.gpu_holder",
                "--model-path",
                str(src_dir),
                "--device",
                target.compute_device,
                "--host",
                node.address,
                "--port",
                str(port),
            ]
            entry = node.services.start(
                f"gpu-{model}-{target_tier}",
                argv,
                node.address,
                port,
                {"kind": "gpu", "model": model, "device": str(target)},
                settings.serve_ready_timeout_s,
            )
            return {"device": str(target), "path": None, "size_bytes": man["total_bytes"], "pid": entry["pid"]}

        return load, None

    staging = node.tiers.staging_dir(target_tier, f"mv-{op_id}")

    def body(rep: Reporter) -> dict[str, Any]:
        if source_tier == target_tier:
            raise InvalidRequest("target_device: the model is already on that device", {"field": "target_device"})
        man = manifest_now()
        rep.set_phase("moving", total=int(man["total_bytes"]))
        copy_tree_verified(src_dir, staging, man, rep.progress)
        rep.set_phase("verifying")
        write_manifest(staging, man)
        install(staging, node.tiers.model_dir(target_tier, model))
        if not keep_source:
            remove_tree(src_dir)
        return {**_location(node, target_tier, model, man), "source_removed": not keep_source}

    return body, lambda: shutil.rmtree(staging, ignore_errors=True)


def op_delete(node: NodeContext, model: str, tier: str) -> Op:
    def body(rep: Reporter) -> dict[str, Any]:
        rep.set_phase("deleting")
        if Device(node.name, tier).is_gpu:
            removed = node.services.stop(f"gpu-{model}-{tier}")
        else:
            removed = remove_tree(node.tiers.model_dir(tier, model))
        return {"device": str(node.tiers.device(tier)), "removed": removed}

    return body, None


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
) -> Op:
    dev = Device.parse(device, field="device")

    def body(rep: Reporter) -> dict[str, Any]:
        existing = node.services.get(service_id)
        if existing is not None:  # a redelivered start: the service already runs
            return {k: existing[k] for k in ("pid", "port", "url")}
        if dev.is_gpu:
            _gpu_index_available(dev)
        use_tier = tier or next((t for t in ("dram", "disk") if _has_model(node, t, model)), None)
        if use_tier is None:
            raise NotFound(f"{model} has no copy on {node.name}'s disk or dram", {"model": model})
        rep.set_phase("starting")
        taken = {int(e["port"]) for e in node.services.entries()}
        if port is not None and (port in taken or not port_free(node.address, port)):
            raise ResourceUnavailable(f"port {port} is in use on {node.name}", {"field": "port", "port": port})
        # A port we picked can be taken between the check and the server's bind: pick again (not a user's port).
        for attempt in range(3):
            chosen = port if port is not None else pick_port(node.address, settings.serve_port_start, taken)
            argv = server_argv(
                backend,
                node.tiers.model_dir(use_tier, model),
                model,
                node.address,
                chosen,
                dev.compute_device,
                config,
                settings.serve_command,
                trust_remote_code,
                settings.serve_cpu_threads,
            )
            try:
                entry = node.services.start(
                    service_id,
                    argv,
                    node.address,
                    chosen,
                    {"kind": "model", "model": model, "device": device},
                    settings.serve_ready_timeout_s,
                    env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                )
                break
            except TaskFailed as exc:
                taken.add(chosen)
                if port is not None or attempt == 2 or port_free(node.address, chosen):
                    raise
                log.warning("port %s was taken while %s started; trying another: %s", chosen, service_id, exc)
        return {"pid": entry["pid"], "port": chosen, "url": entry["url"]}

    return body, None


def _has_model(node: NodeContext, tier: str, model: str) -> bool:
    try:
        return read_manifest(node.tiers.model_dir(tier, model)) is not None
    except ResourceUnavailable:
        return False


def op_stop(node: NodeContext, service_id: str | None, model: str | None = None, device: str | None = None) -> Op:
    def body(rep: Reporter) -> dict[str, Any]:
        sid = service_id
        if sid is None:  # find it by model and device, as a workflow names it
            sid = next(
                (
                    e["service_id"]
                    for e in node.services.entries()
                    if e.get("kind") == "model" and e.get("model") == model and e.get("device") == device
                ),
                None,
            )
            if sid is None:
                raise NotFound(f"no service of {model} on {device}", {"model": model, "device": device})
        entry = node.services.get(sid)
        was_running = node.services.stop(sid)
        port = entry.get("port") if entry else None
        return {
            "service_id": sid,
            "stopped": was_running,
            "port": port,
            "port_free": port is None or port_free(node.address, port),
        }

    return body, None


def _run(task: Task, op_id: str, op: Op) -> dict[str, Any]:
    body, cleanup = op
    return run_op(task, op_id, body, cleanup=cleanup)


@app.task(name=names.MODEL_DOWNLOAD, **OPTS)
def download(self: Task, op_id: str, model: str, source_url: str, tier: str = "disk") -> dict[str, Any]:
    """Download a model from its source into a file tier of this node, verify it, install it atomically."""
    return _run(self, op_id, op_download(require_node(), settings_of(self.app), op_id, model, source_url, tier))


@app.task(name=names.MODEL_COPY, **OPTS)
def copy(
    self: Task,
    op_id: str,
    model: str,
    manifest: dict[str, Any],
    target_tier: str,
    source: dict[str, Any],
    bandwidth_limit: float | None = None,
) -> dict[str, Any]:
    """Pull a model from a peer's file server (or a local tier) into `target_tier`, verify, install."""
    op = op_copy(require_node(), settings_of(self.app), model, manifest, target_tier, source, bandwidth_limit)
    return _run(self, op_id, op)


@app.task(name=names.MODEL_MOVE, **OPTS)
def move(
    self: Task,
    op_id: str,
    model: str,
    manifest: dict[str, Any],
    source_tier: str,
    target_tier: str,
    keep_source: bool = False,
) -> dict[str, Any]:
    """Move (or copy) a model between tiers of this node: disk <-> dram, or load it into GPU memory."""
    op = op_move(require_node(), settings_of(self.app), op_id, model, manifest, source_tier, target_tier, keep_source)
    return _run(self, op_id, op)


@app.task(name=names.MODEL_DELETE, **OPTS)
def delete(self: Task, op_id: str, model: str, tier: str) -> dict[str, Any]:
    """Remove a model from one tier of this node (for gpuN: stop the process holding it)."""
    return _run(self, op_id, op_delete(require_node(), model, tier))


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
) -> dict[str, Any]:
    """Start a model server on this node and wait until it answers /health."""
    op = op_serve(
        require_node(), settings_of(self.app), service_id, model, tier, device, port, backend, config, trust_remote_code
    )
    return _run(self, op_id, op)


@app.task(name=names.SERVICE_STOP, **OPTS)
def stop_service(self: Task, op_id: str, service_id: str) -> dict[str, Any]:
    """Stop a model server (its whole process group) and free its port."""
    return _run(self, op_id, op_stop(require_node(), service_id))
