"""Node tasks for models: download, copy (pull from a peer), move between local tiers, delete, serve, stop.

Each gets plain JSON (paths come only from checked names), does the work on this node, and reports
through `ops.run_op`; the control worker records locations only after a task says the copy is in place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from celery import Task

from .celery_app import NodeTask, app, settings_of
from .devices import Device
from .errors import InvalidRequest, ResourceUnavailable
from .nvml import list_gpus
from .ops import Reporter, run_op
from .serving import pick_port, port_free, server_argv
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
from .transfer import pull_files
from .worker import NodeContext, require_node

OPTS: dict[str, Any] = {"base": NodeTask, "bind": True}


def _location(node: NodeContext, tier: str, model: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "device": f"{node.name}:{tier}",
        "path": str(node.tiers.model_dir(tier, model)),
        "size_bytes": manifest["total_bytes"],
        "manifest": manifest,
    }


@app.task(name="gswarm.node.model.download", **OPTS)
def download(self: Task, op_id: str, model: str, source_url: str, tier: str = "disk") -> dict[str, Any]:
    """Download a model from its source into a file tier of this node, verify it, install it atomically."""
    node = require_node()
    settings = settings_of(self.app)
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

    return run_op(self, op_id, body, cleanup=lambda: shutil.rmtree(staging, ignore_errors=True))


@app.task(name="gswarm.node.model.copy", **OPTS)
def copy(
    self: Task,
    op_id: str,
    model: str,
    manifest: dict[str, Any],
    target_tier: str,
    source: dict[str, Any],
    bandwidth_limit: float | None = None,
) -> dict[str, Any]:
    """Pull a model from a peer's file server (or a local tier) into `target_tier`, verify, install.

    Partial files are kept under a staging key of the model's content, so a retried or repeated copy
    resumes; they are removed when the copy fails for good.
    """
    node = require_node()
    settings = settings_of(self.app)
    staging = node.tiers.staging_dir(target_tier, f"cp-{model}-{manifest_digest(manifest)}")
    final = node.tiers.model_dir(target_tier, model)

    def body(rep: Reporter) -> dict[str, Any]:
        existing = read_manifest(final)
        if existing is not None and manifest_digest(existing) == manifest_digest(manifest):
            return {**_location(node, target_tier, model, manifest), "noop": True}
        rep.set_phase("copying", total=int(manifest["total_bytes"]))
        fetched = int(manifest["total_bytes"])
        if source["node"] == node.name:
            copy_tree_verified(node.tiers.model_dir(source["tier"], model), staging, manifest, rep.progress)
        else:
            fetched = pull_files(
                source["address"],
                int(source["port"]),
                source["token"],
                source["prefix"],
                manifest,
                staging,
                streams=settings.transfer_streams,
                bandwidth_limit=bandwidth_limit,
                progress=rep.progress,
            )
        rep.set_phase("verifying")
        write_manifest(staging, manifest)
        install(staging, final)
        return {**_location(node, target_tier, model, manifest), "fetched_bytes": fetched}

    return run_op(self, op_id, body, cleanup=lambda: shutil.rmtree(staging, ignore_errors=True))


def _gpu_index_available(device: Device) -> None:
    index = device.gpu_index
    gpus = [g["index"] for g in list_gpus()]
    if index not in gpus:
        raise ResourceUnavailable(
            f"{device} is not available: this host has {'GPUs ' + str(gpus) if gpus else 'no GPU'}",
            {"device": str(device), "gpus": gpus},
        )


@app.task(name="gswarm.node.model.move", **OPTS)
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
    node = require_node()
    settings = settings_of(self.app)
    target = Device(node.name, target_tier)
    src_dir = node.tiers.model_dir(source_tier, model)

    if target.is_gpu:

        def load(rep: Reporter) -> dict[str, Any]:
            _gpu_index_available(target)
            rep.set_phase("moving", total=int(manifest["total_bytes"]))
            sid = f"gpu-{model}-{target_tier}"
            port = pick_port(node.address, settings.serve_port_start + 1000, set())
            argv = [
                "python",
                "-m",
                "gswarm_tasks.gpu_holder",
                "--model-path",
                str(src_dir),
                "--device",
                f"cuda:{target.gpu_index}",
                "--host",
                node.address,
                "--port",
                str(port),
            ]
            import sys

            argv[0] = sys.executable
            entry = node.services.start(
                sid,
                argv,
                node.address,
                port,
                {"kind": "gpu", "model": model, "device": str(target)},
                settings.serve_ready_timeout_s,
            )
            return {"device": str(target), "path": None, "size_bytes": manifest["total_bytes"], "pid": entry["pid"]}

        return run_op(self, op_id, load)

    staging = node.tiers.staging_dir(target_tier, f"mv-{op_id}")

    def body(rep: Reporter) -> dict[str, Any]:
        if source_tier == target_tier:
            raise InvalidRequest("target_device: the model is already on that device", {"field": "target_device"})
        rep.set_phase("moving", total=int(manifest["total_bytes"]))
        copy_tree_verified(src_dir, staging, manifest, rep.progress)
        rep.set_phase("verifying")
        write_manifest(staging, manifest)
        install(staging, node.tiers.model_dir(target_tier, model))
        if not keep_source:
            remove_tree(src_dir)
        return {**_location(node, target_tier, model, manifest), "source_removed": not keep_source}

    return run_op(self, op_id, body, cleanup=lambda: shutil.rmtree(staging, ignore_errors=True))


@app.task(name="gswarm.node.model.delete", **OPTS)
def delete(self: Task, op_id: str, model: str, tier: str) -> dict[str, Any]:
    """Remove a model from one tier of this node (for gpuN: stop the process holding it)."""
    node = require_node()

    def body(rep: Reporter) -> dict[str, Any]:
        rep.set_phase("deleting")
        if Device(node.name, tier).is_gpu:
            removed = node.services.stop(f"gpu-{model}-{tier}")
        else:
            removed = remove_tree(node.tiers.model_dir(tier, model))
        return {"device": f"{node.name}:{tier}", "removed": removed}

    return run_op(self, op_id, body)


@app.task(name="gswarm.node.service.start", **OPTS)
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
    node = require_node()
    settings = settings_of(self.app)
    dev = Device.parse(device, field="device")

    def body(rep: Reporter) -> dict[str, Any]:
        existing = node.services.get(service_id)
        if existing is not None:  # a redelivered start: the service already runs
            return {k: existing[k] for k in ("pid", "port", "url")}
        if dev.is_gpu:
            _gpu_index_available(dev)
        rep.set_phase("starting")
        taken = {int(e["port"]) for e in node.services.entries()}
        if port is not None and (port in taken or not port_free(node.address, port)):
            raise ResourceUnavailable(f"port {port} is in use on {node.name}", {"field": "port", "port": port})
        chosen = port if port is not None else pick_port(node.address, settings.serve_port_start, taken)
        torch_device = f"cuda:{dev.gpu_index}" if dev.is_gpu else "cpu"
        argv = server_argv(
            backend,
            node.tiers.model_dir(tier, model),
            model,
            node.address,
            chosen,
            torch_device,
            config,
            settings.serve_command,
            trust_remote_code,
        )
        entry = node.services.start(
            service_id,
            argv,
            node.address,
            chosen,
            {"kind": "model", "model": model, "device": device},
            settings.serve_ready_timeout_s,
            env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        return {"pid": entry["pid"], "port": chosen, "url": entry["url"]}

    return run_op(self, op_id, body)


@app.task(name="gswarm.node.service.stop", **OPTS)
def stop_service(self: Task, op_id: str, service_id: str) -> dict[str, Any]:
    """Stop a model server (its whole process group) and free its port."""
    node = require_node()

    def body(rep: Reporter) -> dict[str, Any]:
        entry = node.services.get(service_id)
        was_running = node.services.stop(service_id)
        port = entry.get("port") if entry else None
        return {"stopped": was_running, "port": port, "port_free": port is None or port_free(node.address, port)}

    return run_op(self, op_id, body)


def model_path_for(node: NodeContext, tier: str, model: str) -> Path:
    return node.tiers.model_dir(tier, model)
