"""The one module that talks to NVML (through nvitop); a host without GPUs gets an empty list."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Protocol

import psutil

log = logging.getLogger(__name__)

# nvitop prints a multi-line FATAL banner through these loggers whenever NVML is missing.
_NOISY_LOGGERS = ("nvitop", "nvitop.api.libnvml")
# nvmlDeviceGetNvLinkState answers NVML_FEATURE_ENABLED for a link that is up.
_LINK_UP = 1


class GpuSource(Protocol):
    """Where GPU facts come from: NVML on a real host, a fake in tests."""

    def available(self) -> bool: ...

    def gpus(self) -> list[dict[str, Any]]: ...

    def sample(self, bandwidth: bool, nvlink: bool) -> list[dict[str, Any]]: ...


class NvitopSource:
    """GPUs through nvitop; NVML is started lazily and a missing library is remembered, not retried each call.

    A reading NVML cannot give (NOT_SUPPORTED, or any other error) is left out of the row rather than written as
    0 or null, so that a consumer never mistakes "unknown" for "idle".
    """

    retry_after_s = 300.0
    # An NVLink rate is the difference of two counter readings; one older than this is not worth differencing.
    nvlink_stale_s = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: list[Any] | None = None
        self._failed_at: float | None = None
        self._nvlink_read_at: dict[int, float] = {}
        self.reason: str | None = None

    def _load(self) -> list[Any]:
        with self._lock:
            if self._devices is not None:
                return self._devices
            if self._failed_at is not None and time.monotonic() - self._failed_at < self.retry_after_s:
                return []
            saved: list[tuple[logging.Logger, int]] = []
            try:
                from nvitop import Device  # importing nvitop resets its logger level, so silence after

                saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in _NOISY_LOGGERS]
                for lg, _ in saved:
                    lg.setLevel(logging.CRITICAL + 1)
                # Device.all() answers [] when NVML fails to start, which would pass for a host without GPUs
                # and never be retried; Device.count() raises instead.
                self._devices = list(Device.all()) if Device.count() else []
                self.reason = None
                return self._devices
            except Exception as exc:  # any NVML failure means "no GPUs here", never a crash
                self.reason = f"{type(exc).__name__}: {exc}"
                if self._failed_at is None:  # once per process: a retry that fails again says nothing new
                    log.info("no NVIDIA GPUs visible on this host (%s)", self.reason)
                self._failed_at = time.monotonic()
                return []
            finally:
                for lg, level in saved:
                    lg.setLevel(level)

    def available(self) -> bool:
        return bool(self._load())

    def gpus(self) -> list[dict[str, Any]]:
        """Each GPU's identity, memory, load and temperature, as a heartbeat announces them."""
        out = []
        for dev in self._load():
            with dev.oneshot():
                row = _identity(dev)
                _put(row, "memory_total_bytes", _num(dev.memory_total()))
                _put(row, "memory_used_bytes", _num(dev.memory_used()))
                _put(row, "utilization_percent", _num(dev.gpu_utilization()))
                _put(row, "temperature_c", _num(dev.temperature()))
            out.append(row)
        return out

    def sample(self, bandwidth: bool = True, nvlink: bool = False) -> list[dict[str, Any]]:
        """One reading of every GPU; units in the names (bytes, bytes/s, percent, C, W, MHz)."""
        out = []
        for dev in self._load():
            with dev.oneshot():
                row = _identity(dev)
                total, used = _num(dev.memory_total()), _num(dev.memory_used())
                _put(row, "utilization_percent", _num(dev.gpu_utilization()))
                _put(row, "memory_used_bytes", used)
                _put(row, "memory_total_bytes", total)
                if used is not None and total:
                    row["memory_percent"] = round(100.0 * used / total, 2)
                _put(row, "temperature_c", _num(dev.temperature()))
                power_mw = _num(dev.power_usage())
                if power_mw is not None:
                    row["power_w"] = round(power_mw / 1000.0, 3)
                _put(row, "sm_clock_mhz", _num(dev.sm_clock()))
                _put(row, "memory_clock_mhz", _num(dev.memory_clock()))
                _put(row, "processes", _processes(dev))
                if bandwidth:  # NVML reports KiB/s; rx is host -> GPU, tx is GPU -> host
                    rx, tx = _num(dev.pcie_rx_throughput()), _num(dev.pcie_tx_throughput())
                    if rx is not None:
                        row["pcie_rx_bytes_per_s"] = rx * 1024
                    if tx is not None:
                        row["pcie_tx_bytes_per_s"] = tx * 1024
                if nvlink:
                    row.update(self._nvlink(dev))
            out.append(row)
        return out

    def _nvlink(self, dev: Any) -> dict[str, int]:
        """NVLink bytes/s summed over the links that are up; nothing for a GPU without NVLink or with none up."""
        from nvitop.api import libnvml

        count = dev.nvlink_link_count()  # 0 where NVLink is not supported; nvitop remembers it per device
        up = [
            i
            for i in range(count)
            if libnvml.nvmlQuery("nvmlDeviceGetNvLinkState", dev.handle, i) == _LINK_UP
        ]
        if not up:
            return {}
        now = time.monotonic()
        stale = now - self._nvlink_read_at.get(dev.index, -math.inf) > self.nvlink_stale_s
        self._nvlink_read_at[dev.index] = now
        # nvitop differences against its previous reading; after a pause (NVLink off, or the first sample) that
        # reading is old, so measure over a short fresh interval instead of averaging over the pause.
        links = dev.nvlink_throughput(interval=0.02 if stale else None)
        measured = [links[i] for i in up if i < len(links)]
        out: dict[str, int] = {}
        for key, kib in (
            ("nvlink_tx_bytes_per_s", [_num(link.tx) for link in measured]),
            ("nvlink_rx_bytes_per_s", [_num(link.rx) for link in measured]),
        ):
            known = [v for v in kib if v is not None]
            if known:  # NVML counts KiB
                out[key] = int(sum(known)) * 1024
        return out


def _identity(dev: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"index": _num(dev.index)}
    _put(row, "uuid", _str(dev.uuid()))
    _put(row, "name", _str(dev.name()))
    return row


def _processes(dev: Any) -> list[dict[str, Any]] | None:
    """The processes holding memory on a GPU: pid, and name and bytes where known; None where NVML cannot tell."""
    from nvitop.api import libnvml

    # Not dev.processes(): that also asks NVML for per-process utilisation, which gswarm does not report and which
    # is the costliest call of a sample (about 1.4 ms of CPU per GPU on an H100).
    memory: dict[int, int | None] | None = None
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        listed = libnvml.nvmlQuery(query, dev.handle, default=None)
        if listed is None:
            continue
        memory = memory if memory is not None else {}
        for p in listed:
            if (
                memory.get(p.pid) is None
            ):  # a process with both contexts is listed twice: keep a figure over none
                memory[p.pid] = (
                    p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None
                )  # None: MIG, WDDM
    if memory is None:
        return None
    out = []
    for pid, used in memory.items():
        entry: dict[str, Any] = {"pid": pid}
        _put(entry, "name", _process_name(pid))
        _put(entry, "gpu_memory_bytes", used)
        out.append(entry)
    return out


def _process_name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:  # gone since NVML listed it, or in another PID namespace (a node inside a container)
        return None


def _put(row: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        row[key] = value


class FakeGpuSource:
    """Deterministic GPUs for tests and benchmarks (`GSWARM_FAKE_GPUS=N`): readings follow a slow sine."""

    def __init__(
        self, count: int, name: str = "Fake H100 80GB", memory_total_bytes: int = 80 * 1024**3
    ) -> None:
        self.count = count
        self.name = name
        self.total = memory_total_bytes
        self.t0 = time.monotonic()

    def available(self) -> bool:
        return self.count > 0

    def gpus(self) -> list[dict[str, Any]]:
        total = self.total
        return [
            {
                "index": i,
                "uuid": f"GPU-fake-{i:04d}",
                "name": self.name,
                "memory_total_bytes": total,
                "memory_used_bytes": total // 4,
                "utilization_percent": 50,
                "temperature_c": 40,
            }
            for i in range(self.count)
        ]

    def sample(self, bandwidth: bool = True, nvlink: bool = False) -> list[dict[str, Any]]:
        import math

        t = time.monotonic() - self.t0
        total = self.total
        out = []
        for g in self.gpus():
            i = g["index"]
            util = round(50 + 45 * math.sin(t / 5 + i), 1)
            used = int(total * (0.3 + 0.2 * math.sin(t / 7 + i)))
            row = {
                **g,
                "utilization_percent": util,
                "memory_used_bytes": used,
                "memory_percent": round(100.0 * used / total, 2),
                "temperature_c": 40 + i,
                "power_w": 300.0 + i,
                "sm_clock_mhz": 1755,
                "memory_clock_mhz": 2619,
                "processes": [],
            }
            if bandwidth:
                row["pcie_rx_bytes_per_s"], row["pcie_tx_bytes_per_s"] = 12_000_000_000 + i, 3_000_000_000 + i
            if nvlink:
                row["nvlink_rx_bytes_per_s"], row["nvlink_tx_bytes_per_s"] = 100_000_000_000, 90_000_000_000
            out.append(row)
        return out


def _num(v: Any) -> int | float | None:
    # nvitop maps an NVML error to the NA sentinel (a str); numbers stay numbers, NA becomes None (left out).
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v != "N/A" else None


_default: GpuSource | None = None


def default_source() -> GpuSource:
    """NVML through nvitop; `GSWARM_FAKE_GPUS=N` puts N fake GPUs there instead (tests, benchmarks)."""
    global _default
    if _default is None:
        import os

        fake = int(os.environ.get("GSWARM_FAKE_GPUS") or 0)
        memory = int(float(os.environ.get("GSWARM_FAKE_GPU_MEMORY") or 80 * 1024**3))  # bytes per fake GPU
        _default = FakeGpuSource(fake, memory_total_bytes=memory) if fake else NvitopSource()
    return _default


def list_gpus(source: GpuSource | None = None) -> list[dict[str, Any]]:
    """The GPUs of this host as plain dicts; [] when NVML is absent."""
    return (source or default_source()).gpus()
