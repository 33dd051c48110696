"""Starting a model server from a preset: its command line, its minimal environment with its GPUs, its per-service
key, a check that its program is installed, and for the built-in server a start from the node's warm starter."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..context import NodeContext, pick_port, port_bindable, port_free
from ..devices import Device
from ..errors import Forbidden, ResourceUnavailable, TaskFailed
from ..settings import Settings
from .engines import Engine
from .installed import python_for, search_path
from .keys import new_key, write_key
from .kinds import gguf_file, preset_flags
from .replicas import server_env

log = logging.getLogger(__name__)


def server_argv(
    preset: Engine,
    model_path: Path,
    model_name: str,
    host: str,
    port: int,
    device: str,
    params: dict[str, Any],
    trust_remote_code: bool,
    cpu_threads: int,
    engine_paths: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line of a model server: the preset's template, its documented parameters, the flags its engine
    needs for this model (`kinds.preset_flags`), the built-in server's device and default threads. `device` is what
    the server sees (`cpu`, or `cuda:0` with CUDA_VISIBLE_DEVICES)."""
    python = sys.executable if preset.name == "builtin" else python_for(preset.name, engine_paths or {})
    path = (gguf_file(model_path) or model_path) if preset.takes_file else model_path
    values = {"python": python, "path": str(path), "host": host, "port": str(port), "model": model_name}
    if preset.name == "builtin":
        params = {"threads": cpu_threads, **params}
    argv = preset.command(values, params) + preset_flags(preset.name, model_path, device != "cpu", params)
    if preset.name == "builtin":
        argv += ["--device", device]
    if trust_remote_code and preset.trust_flag:
        argv.append(preset.trust_flag)
    return argv


def engine_env(
    preset: Engine, env: dict[str, str], engine_paths: Mapping[str, str], host: str, cpu: bool
) -> None:
    """What a preset's server needs in its environment besides the minimal one: its engine's bin/ on the PATH and,
    for vLLM, the address its processes talk on and, on a CPU, a KV cache that fits beside everything else and no
    thread pinning. vLLM's CPU build pins each server's threads to the same cores (`auto`), so two replicas on one
    node (a rolling update, a scale-up) share one core and the second one's pinning can wait for ever on a busy
    core; unpinned, the kernel spreads them. A node may set its own VLLM_CPU_KVCACHE_SPACE and
    VLLM_CPU_OMP_THREADS_BIND (a core list per replica, or `auto`)."""
    env["PATH"] = search_path(preset.name, engine_paths, env.get("PATH", os.defpath))
    if preset.name == "vllm":
        env["VLLM_HOST_IP"] = host
        if cpu:
            env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
            env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def missing_program(preset: Engine, argv: list[str], env: dict[str, str]) -> str | None:
    """Why the preset cannot start on this host (its program, or its Python module, is not installed), else None."""
    exe = shutil.which(argv[0], path=env.get("PATH"))
    if exe is None:
        return f"executable {argv[0]!r} of the {preset.name} preset is not installed on this node (PATH={env['PATH']})"
    python_module = preset.argv[0] == "{python}" or Path(argv[0]).name.startswith("python")
    if (
        python_module and len(argv) > 2 and argv[1] == "-m" and preset.name != "builtin"
    ):  # llama-server -m: a file
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
        try:
            found = subprocess.run([exe, "-c", probe, argv[2]], env=env, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot run {exe} for the {preset.name} preset: {exc}"
        if found.returncode != 0:
            return f"module {argv[2]!r} of the {preset.name} preset is not installed for {exe} on this node"
    return None


def installed(preset: Engine, engine_paths: Mapping[str, str] | None = None) -> bool:
    """Whether the preset's program (and, for `python -m`, its module) is installed on this node."""
    paths = engine_paths or {}
    python = sys.executable if preset.name == "builtin" else python_for(preset.name, paths)
    values = {"python": python, "path": "/m", "host": "127.0.0.1", "port": "1", "model": "m"}
    env = server_env(cpu=True)
    env["PATH"] = search_path(preset.name, paths, env["PATH"])
    return missing_program(preset, preset.command(values, {}), env) is None


def watched_pid() -> int:
    """The node worker's main process: a warm starter lives as long as it (a task runs in a pool child of it)."""
    try:
        from billiard.process import current_process

        in_pool = current_process().name.startswith("ForkPoolWorker")
    except Exception:  # not under a Celery prefork pool
        in_pool = False
    return os.getppid() if in_pool else os.getpid()


def prewarm(node: NodeContext, settings: Settings) -> bool:
    """Start the node's warm starter for built-in servers unless it runs; True when started now."""
    if not settings.serve_warm_start:
        return False
    return node.services.warm.ensure(server_env(cpu=True), watched_pid())


def launch(
    node: NodeContext,
    settings: Settings,
    service_id: str,
    what: tuple[str, Path, Device, int | None],
    preset: Engine,
    params: dict[str, Any],
    trust_remote_code: bool,
    gpus: list[int] | None = None,
) -> dict[str, Any]:
    """Start `preset` serving `what` (model, its directory, device, port or None) on `gpus` of the node (its device's
    alone by default; several for tensor parallelism) and wait until it is ready; its registry entry, with its
    `key`."""
    model, model_dir, dev, port = what
    if trust_remote_code and not settings.allow_remote_code:
        raise Forbidden(
            f"cannot serve {model} on {node.name}: it is registered with trust_remote_code, which runs the model "
            "directory's own Python code on the node; this node refuses that (set models.allow_remote_code, or "
            "GSWARM_MODELS_ALLOW_REMOTE_CODE=1, in its own configuration to allow it)",
            {"field": "trust_remote_code", "node": node.name, "setting": "models.allow_remote_code"},
        )
    taken = {int(e["port"]) for e in node.services.entries()}
    if port is not None and (port in taken or not port_bindable(node.address, port)):
        raise ResourceUnavailable(f"port {port} is in use on {node.name}", {"field": "port", "port": port})
    key_file, key = node.services.key_file(service_id), new_key()
    env = server_env((gpus or [int(dev.gpu_index or 0)]) if dev.is_gpu else None, cpu=not dev.is_gpu)
    engine_env(preset, env, settings.serve_engine_paths, node.address, cpu=not dev.is_gpu)
    if preset.key_env:
        env[preset.key_env] = key
    meta = {"kind": "model", "model": model, "device": str(dev), "engine": preset.name, "gpus": gpus}
    meta.update(
        health_path=preset.health_path, ready_path=preset.probe_path, metrics_path=preset.metrics_path
    )
    warm = node.services.warm if preset.name == "builtin" and settings.serve_warm_start else None
    # A port we picked can be taken between the check and the server's bind: pick again (not a user's port).
    for attempt in range(3):
        chosen = port if port is not None else pick_port(node.address, settings.serve_port_start, taken)
        device = "cuda:0" if dev.is_gpu else "cpu"  # the first GPU CUDA_VISIBLE_DEVICES leaves it
        argv = server_argv(preset, model_dir, model, node.address, chosen, device, params, trust_remote_code,
                           settings.serve_cpu_threads, settings.serve_engine_paths)  # fmt: skip
        write_key(key_file, key)  # the node's record of it; again on each attempt (a failed start removes it)
        if preset.name == "builtin":
            argv += ["--key-file", str(key_file)]
        missing = missing_program(preset, argv, env)
        if missing is not None:
            key_file.unlink(missing_ok=True)
            raise ResourceUnavailable(
                f"cannot start {model} on {node.name}: {missing}",
                {"engine": preset.name, "executable": argv[0], "node": node.name},
            )
        try:
            entry = node.services.start(
                service_id,
                argv,
                node.address,
                chosen,
                meta,
                settings.serve_ready_timeout_s,
                env=env,
                warm=warm,
            )
            if warm is not None and not entry.get("warm_start"):
                prewarm(node, settings)  # the next built-in server here starts warm
            return {**entry, "key": key}
        except TaskFailed as exc:
            taken.add(chosen)
            if port is not None or attempt == 2 or port_free(node.address, chosen):
                raise
            log.warning("port %s was taken while %s started; trying another: %s", chosen, service_id, exc)
    raise AssertionError("unreachable")
