"""Node tasks for models: download, copy (pull from a peer), move between local tiers (or into a GPU), delete.

Each operation is a plain function (`op_*`) of the node, the settings and a Reporter; the Celery tasks
here and the workflow steps call the same functions. Paths come only from checked names; the control
worker records a location only after a task says the copy is in place.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Task

from .. import names
from ..celery_app import NodeTask, app, settings_of
from ..context import NodeContext, pick_port, require_node
from ..devices import Device
from ..errors import InvalidRequest, NotFound, ResourceUnavailable
from ..locks import model_leases
from ..profiling.nvml import list_gpus
from ..reporting import Reporter, redis_of, run_op
from ..settings import Settings
from ..storage import (
    build_manifest,
    check_tree,
    copy_tree_verified,
    install,
    manifest_digest,
    read_manifest,
    remove_tree,
    reserve,
    tree_size,
    write_manifest,
)
from ..transfer.client import fetch_manifest, pull_files
from ..transfer.tokens import read_grant
from .sources import copy_local, download_hf, parse_source, verify_against_hub

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


def _reserve(node: NodeContext, settings: Settings, tier: str, staging: Path, need: int, model: str) -> None:
    """models.cache_size bounds the models on the disk tier: room for `need` bytes is taken before they come."""
    if tier == "disk":
        reserve(node.tiers.root("disk") / "models", staging, need, settings.cache_size, model)


def op_download(
    node: NodeContext, settings: Settings, op_id: str, model: str, source_url: str, tier: str
) -> Op:
    staging = node.tiers.staging_dir(tier, f"dl-{op_id}")

    def body(rep: Reporter) -> dict[str, Any]:
        source = parse_source(source_url, settings.allowed_roots)
        rep.set_phase("downloading")
        staging.mkdir(parents=True, exist_ok=True)

        def on_total(n: int) -> None:
            _reserve(node, settings, tier, staging, n, model)
            rep.set_phase("downloading", total=n)

        if source.scheme == "hf":
            meta = download_hf(source, staging, rep.progress, on_total=on_total)
        else:
            assert source.path is not None
            local = Path(source.path)
            on_total(tree_size(local) if local.is_dir() else local.stat().st_size)
            meta = copy_local(source, staging, rep.progress, settings.allowed_roots)
        rep.set_phase("verifying", reset=True)
        manifest = build_manifest(staging, rep.progress)
        if "expected" in meta:
            verify_against_hub(staging, manifest, meta.pop("expected"))
        manifest["source"] = {"url": source_url, **meta}
        write_manifest(staging, manifest)
        install(staging, node.tiers.model_dir(tier, model), manifest)
        return _location(node, tier, model, manifest)

    return body, lambda: shutil.rmtree(staging, ignore_errors=True)


def op_copy(
    node: NodeContext,
    settings: Settings,
    op_id: str,
    model: str,
    manifest: dict[str, Any] | None,
    target_tier: str,
    source: dict[str, Any],
    bandwidth_limit: float | None,
    compression: str = "none",
) -> Op:
    """Pull from a peer's file server (or copy from a local tier) into `target_tier`; resumable by the same
    operation (its staging directory is its own), verified before it is installed. `compression` (none, zstd) is
    what the peer does to the bytes on the wire."""
    staging = node.tiers.staging_dir(target_tier, f"cp-{op_id}")

    def body(rep: Reporter) -> dict[str, Any]:
        local = source["node"] == node.name
        if not local:
            prefix, token = read_grant(rep.client, settings, source, "models", model)
        man = manifest
        if man is None:  # a workflow step: the manifest travels with the model, read it from the source
            man = (
                read_manifest(node.tiers.model_dir(source["tier"], model))
                if local
                else fetch_manifest(source["address"], int(source["port"]), token, prefix)
            )
            if man is None:
                raise NotFound(
                    f"{model} is not on {Device(source['node'], source['tier'])}", {"model": model}
                )
        final = node.tiers.model_dir(target_tier, model)
        existing = read_manifest(final)
        if existing is not None and manifest_digest(existing) == manifest_digest(man):
            return {**_location(node, target_tier, model, man), "noop": True, "fetched_bytes": 0}
        _reserve(node, settings, target_tier, staging, int(man["total_bytes"]), model)
        rep.set_phase("copying", total=int(man["total_bytes"]))
        fetched = int(man["total_bytes"])
        wire: dict[str, Any] = {}
        if local:
            copy_tree_verified(node.tiers.model_dir(source["tier"], model), staging, man, rep.progress)
        else:
            fetched = pull_files(
                source["address"],
                int(source["port"]),
                token,
                prefix,
                man,
                staging,
                streams=settings.transfer_streams,
                bandwidth_limit=bandwidth_limit,
                progress=rep.progress,
                compression=compression,
                stats=wire,
            )
            wire["compression"] = compression
        rep.set_phase("verifying")
        write_manifest(staging, man)
        install(staging, final, man)
        return {**_location(node, target_tier, model, man), "fetched_bytes": fetched, **wire}

    return body, lambda: shutil.rmtree(staging, ignore_errors=True)


def gpu_index_available(device: Device) -> None:
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
            gpu_index_available(target)
            man = manifest_now()
            rep.set_phase("moving", total=int(man["total_bytes"]))
            port = pick_port(node.address, settings.serve_port_start + 1000, set())
            argv = [
                sys.executable,
                "-m",
                "gswarm_tasks.models.gpu_holder",
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
            return {
                "device": str(target),
                "path": None,
                "size_bytes": man["total_bytes"],
                "pid": entry["pid"],
            }

        return load, None

    staging = node.tiers.staging_dir(target_tier, f"mv-{op_id}")

    def body(rep: Reporter) -> dict[str, Any]:
        if source_tier == target_tier:
            raise InvalidRequest(
                "target_device: the model is already on that device", {"field": "target_device"}
            )
        man = manifest_now()
        _reserve(node, settings, target_tier, staging, int(man["total_bytes"]), model)
        rep.set_phase("moving", total=int(man["total_bytes"]))
        copy_tree_verified(src_dir, staging, man, rep.progress)
        rep.set_phase("verifying")
        write_manifest(staging, man)
        install(staging, node.tiers.model_dir(target_tier, model), man)
        if not keep_source:
            remove_tree(src_dir)
        return {**_location(node, target_tier, model, man), "source_removed": not keep_source}

    return body, lambda: shutil.rmtree(staging, ignore_errors=True)


def op_register(node: NodeContext, model: str, tier: str, manifest: dict[str, Any] | None) -> Op:
    """A copy already in this tier's model directory: every file checked against `manifest` (exactly its files,
    each of its size and hash), or the manifest built from the files when the model has none; then reported."""

    def body(rep: Reporter) -> dict[str, Any]:
        final = node.tiers.model_dir(tier, model)
        device = node.tiers.device(tier)
        if not final.is_dir():
            raise NotFound(f"{model} is not on {device}: {final} is not a directory", {"model": model})
        rep.set_phase("verifying", total=int((manifest or {}).get("total_bytes") or tree_size(final)))
        if manifest is None:
            man = build_manifest(final, rep.progress)
            if not man["files"]:
                raise NotFound(f"{model} is not on {device}: {final} holds no file", {"model": model})
        else:
            check_tree(final, manifest, hashed=False)
            man = manifest
        write_manifest(final, man)
        return {**_location(node, tier, model, man), "registered": True}

    return body, None


def op_delete(node: NodeContext, model: str, tier: str) -> Op:
    def body(rep: Reporter) -> dict[str, Any]:
        rep.set_phase("deleting")
        if Device(node.name, tier).is_gpu:
            removed = node.services.stop(f"gpu-{model}-{tier}")
        else:
            removed = remove_tree(node.tiers.model_dir(tier, model))
        return {"device": str(node.tiers.device(tier)), "removed": removed}

    return body, None


def run_task(
    task: Task, op_id: str, op: Op, model: str | None = None, tiers: list[str] | None = None
) -> dict[str, Any]:
    """Run an operation; one that writes or removes `model`'s copies on `tiers` holds them until it has reported,
    so a second operation on the same copy waits its turn and the reports reach the control plane in that order."""
    body, cleanup = op
    if model is None or not tiers:
        return run_op(task, op_id, body, cleanup=cleanup)
    node = require_node()
    with model_leases(redis_of(task), node.name, tiers, model, owner=op_id):
        return run_op(task, op_id, body, cleanup=cleanup)


def lease_tiers(node: str, action: str, params: dict[str, Any]) -> list[str]:
    """The tiers of `node` whose copy of the model a workflow's model action writes, removes or reads (a move's or
    a local copy's source): held while the step runs and reports, as the standalone operations hold them."""
    keys = {"download": ["target_device"], "copy": ["target_device", "source_device"], "delete": ["device"]}
    keys["move"] = keys["copy"]
    tiers = set()
    for key in keys.get(action, []):
        text = params.get(key)
        if isinstance(text, str) and text:
            dev = Device.parse(text, field=key)
            if dev.node == node:
                tiers.add(dev.tier)
    return sorted(tiers)


@app.task(name=names.MODEL_DOWNLOAD, **OPTS)
def download(self: Task, op_id: str, model: str, source_url: str, tier: str = "disk") -> dict[str, Any]:
    """Download a model from its source into a file tier of this node, verify it, install it atomically."""
    op = op_download(require_node(), settings_of(self.app), op_id, model, source_url, tier)
    return run_task(self, op_id, op, model, [tier])


@app.task(name=names.MODEL_COPY, **OPTS)
def copy(
    self: Task,
    op_id: str,
    model: str,
    manifest: dict[str, Any],
    target_tier: str,
    source: dict[str, Any],
    bandwidth_limit: float | None = None,
    compression: str = "none",
) -> dict[str, Any]:
    """Pull a model from a peer's file server (or a local tier) into `target_tier`, verify, install."""
    node = require_node()
    settings = settings_of(self.app)
    op = op_copy(node, settings, op_id, model, manifest, target_tier, source, bandwidth_limit, compression)
    local = [str(source["tier"])] if source.get("node") == node.name else []
    return run_task(self, op_id, op, model, [target_tier, *local])


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
    op = op_move(
        require_node(), settings_of(self.app), op_id, model, manifest, source_tier, target_tier, keep_source
    )
    return run_task(self, op_id, op, model, [source_tier, target_tier])


@app.task(name=names.MODEL_REGISTER, **OPTS)
def register(
    self: Task, op_id: str, model: str, tier: str, manifest: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Verify a model copy that is already in a file tier of this node, and report it."""
    return run_task(self, op_id, op_register(require_node(), model, tier, manifest), model, [tier])


@app.task(name=names.MODEL_DELETE, **OPTS)
def delete(self: Task, op_id: str, model: str, tier: str) -> dict[str, Any]:
    """Remove a model from one tier of this node (for gpuN: stop the process holding it)."""
    return run_task(self, op_id, op_delete(require_node(), model, tier), model, [tier])
