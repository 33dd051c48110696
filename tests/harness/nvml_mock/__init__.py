"""A mock `libnvidia-ml.so.1` for tests: compiled here with the system C compiler, fed from a JSON file.

The library (mock_nvml.c beside this file) answers the NVML calls that nvitop makes for what gswarm samples.
A process uses it when it is started with `library_env(lib_dir, config_path)` in its environment: the library's
folder first on `LD_LIBRARY_PATH`, and `GSWARM_MOCK_NVML_CONFIG` naming the JSON file. The file may be rewritten
with `write_config` while that process runs; the library notices the change on its next call.

The document (mock_nvml.c's header says which NVML call reads each key; unknown keys are refused):

    {
      "init_error": null | "DRIVER_NOT_LOADED" | "NO_PERMISSION" | "LIBRARY_NOT_FOUND" | ... | <NVML code>,
      "driver_version": "550.54.15", "nvml_version": "12.550.54.15", "cuda_driver_version": 12040,
      "devices": [
        {
          "name": str, "uuid": str,
          "memory_total_bytes": int, "memory_used_bytes": int, "memory_reserved_bytes": int,
          "utilization_gpu_percent": int, "utilization_memory_percent": int,
          "encoder_utilization_percent": int, "decoder_utilization_percent": int,
          "temperature_c": int, "power_usage_mw": int, "power_limit_mw": int,
          "graphics_clock_mhz": int, "sm_clock_mhz": int, "memory_clock_mhz": int, "video_clock_mhz": int,
          "pcie_rx_kib_per_s": int,  (host -> GPU)
          "pcie_tx_kib_per_s": int,  (GPU -> host)
          "nvlink": [{"active": bool, "rx_kib_per_s": int, "tx_kib_per_s": int}, ...],
          "processes": [{"pid": int, "used_gpu_memory_bytes": int | null, "type": "compute" | "graphics"}, ...],
          "not_supported": [query, ...]  with query one of memory, utilization, encoder_utilization,
                                         decoder_utilization, temperature, power_usage, power_limit,
                                         graphics_clock, sm_clock, memory_clock, video_clock, pcie_rx,
                                         pcie_tx, nvlink, processes
        }
      ]
    }

A missing number reads as 0; a device whose memory_total_bytes is 0 is taken by nvitop for a unified-memory
device and reported with the host's memory, so give every device its memory. nvitop names a process by asking
psutil about its pid, so a test that wants a name puts a real pid there (its own, or a child's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("mock_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
CONFIG_ENV = "GSWARM_MOCK_NVML_CONFIG"
_FLAGS = ("-shared", "-fPIC", "-O2", "-pthread")


def build_library(dest_dir: Path, compiler: str | None = None) -> Path:
    """Compile the mock into `dest_dir/<source hash>/libnvidia-ml.so.1`, or return the build already there."""
    cc = compiler or os.environ.get("CC") or "cc"
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *_FLAGS)).encode()).hexdigest()[:16]
    # One folder per source version, so LD_LIBRARY_PATH names a folder holding exactly this build.
    lib = dest_dir / digest / LIBRARY_NAME
    if lib.is_file():
        return lib
    if shutil.which(cc) is None:
        raise RuntimeError(f"the NVML mock needs a C compiler, and {cc!r} is not on PATH")
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f".{LIBRARY_NAME}.{os.getpid()}")
    done = subprocess.run([cc, *_FLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"compiling {SOURCE.name} with {cc} failed:\n{done.stderr}")
    os.replace(tmp, lib)  # whole or absent, also when two test processes build at once
    return lib


def write_config(path: Path, doc: dict[str, Any]) -> None:
    """Replace the mock's JSON file in one step, so the library never reads half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    # The library looks for a new inode, size or mtime; file mtimes tick coarsely (a few ms), and a freed inode
    # can come back, so move the mtime past the old file's to make every write visible.
    try:
        old = path.stat().st_mtime_ns
    except FileNotFoundError:
        old = 0
    mtime = max(time.time_ns(), old + 1_000_000)
    os.utime(tmp, ns=(mtime, mtime))
    os.replace(tmp, path)


def library_env(lib_dir: Path, config_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process (a node worker, a sampler) that loads the mock instead of a driver."""
    env = dict(os.environ if base is None else base)
    env.pop("GSWARM_FAKE_GPUS", None)  # fake GPUs would bypass NVML altogether
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    env[CONFIG_ENV] = str(config_path)
    return env


def device(index: int = 0, **values: Any) -> dict[str, Any]:
    """One device of the document: an idle H100 with distinct identity per index, `values` on top."""
    doc: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index:08x}-0000-4000-8000-000000000000",
        "memory_total_bytes": 80 * 1024**3,
        "memory_used_bytes": 0,
        "utilization_gpu_percent": 0,
        "utilization_memory_percent": 0,
        "temperature_c": 30,
        "power_usage_mw": 70_000,
        "power_limit_mw": 700_000,
        "graphics_clock_mhz": 345,
        "sm_clock_mhz": 345,
        "memory_clock_mhz": 2619,
        "video_clock_mhz": 765,
        "pcie_rx_kib_per_s": 0,
        "pcie_tx_kib_per_s": 0,
        "nvlink": [],
        "processes": [],
    }
    doc.update(values)
    return doc
