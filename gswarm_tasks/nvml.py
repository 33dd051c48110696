"""The one module that talks to NVML (through nvitop); a host without GPUs gets an empty list."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

log = logging.getLogger(__name__)

# nvitop prints a multi-line FATAL banner through these loggers whenever NVML is missing.
_NOISY_LOGGERS = ("nvitop", "nvitop.api.libnvml")


class GpuSource(Protocol):
    """Where GPU facts come from: NVML on a real host, a fake in tests."""

    def available(self) -> bool: ...

    def gpus(self) -> list[dict[str, Any]]: ...

    def sample(self, bandwidth: bool, nvlink: bool) -> list[dict[str, Any]]: ...


class NvitopSource:
    """GPUs through nvitop; NVML is started lazily and a missing library is remembered, not retried each call."""

    retry_after_s = 300.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: list[Any] | None = None
        self._failed_at: float | None = None
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
                self._devices = list(Device.all())
                self.reason = None
                return self._devices
            except Exception as exc:  # any NVML failure means "no GPUs here", never a crash
                if self._failed_at is None:
                    log.info("no NVIDIA GPUs visible on this host (%s)", type(exc).__name__)
                self._failed_at = time.monotonic()
                self.reason = f"{type(exc).__name__}: {exc}"
                return []
            finally:
                for lg, level in saved:
                    lg.setLevel(level)

    def available(self) -> bool:
        return bool(self._load())

    def gpus(self) -> list[dict[str, Any]]:
        out = []
        for dev in self._load():
            out.append(
                {
                    "index": _num(dev.index),
                    "uuid": _str(dev.uuid()),
                    "name": _str(dev.name()),
                    "memory_total_bytes": _num(dev.memory_total()),
                    "memory_used_bytes": _num(dev.memory_used()),
                    "utilization_percent": _num(dev.gpu_utilization()),
                    "temperature_c": _num(dev.temperature()),
                }
            )
        return out

    def sample(self, bandwidth: bool = True, nvlink: bool = False) -> list[dict[str, Any]]:
        """One reading of every GPU; units in the names (bytes, bytes/s, percent, C, W, MHz)."""
        out = []
        for dev in self._load():
            with dev.oneshot():
                total, used = _num(dev.memory_total()), _num(dev.memory_used())
                power_mw = _num(dev.power_usage())
                row: dict[str, Any] = {
                    "index": _num(dev.index),
                    "uuid": _str(dev.uuid()),
                    "name": _str(dev.name()),
                    "utilization_percent": _num(dev.gpu_utilization()),
                    "memory_used_bytes": used,
                    "memory_total_bytes": total,
                    "memory_percent": round(100.0 * used / total, 2) if used is not None and total else None,
                    "temperature_c": _num(dev.temperature()),
                    "power_w": round(power_mw / 1000.0, 3) if power_mw is not None else None,
                    "sm_clock_mhz": _num(dev.sm_clock()),
                    "memory_clock_mhz": _num(dev.memory_clock()),
                    "processes": [
                        {"pid": p.pid, "gpu_memory_bytes": _num(p.gpu_memory())} for p in dev.processes().values()
                    ],
                }
                if bandwidth:  # NVML reports KiB/s; rx is host -> GPU, tx is GPU -> host
                    rx, tx = _num(dev.pcie_rx_throughput()), _num(dev.pcie_tx_throughput())
                    row["pcie_rx_bytes_per_s"] = rx * 1024 if rx is not None else None
                    row["pcie_tx_bytes_per_s"] = tx * 1024 if tx is not None else None
                if nvlink:
                    links = [(_num(t), _num(r)) for t, r in (dev.nvlink_throughput() or [])]
                    row["nvlink_tx_bytes_per_s"] = sum(t or 0 for t, _ in links) * 1024
                    row["nvlink_rx_bytes_per_s"] = sum(r or 0 for _, r in links) * 1024
            out.append(row)
        return out


class FakeGpuSource:
    """Deterministic GPUs for tests and benchmarks (`GSWARM_FAKE_GPUS=N`): readings follow a slow sine."""

    def __init__(self, count: int, name: str = "Fake H100 80GB", memory_total_bytes: int = 80 * 1024**3) -> None:
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
    # nvitop maps an NVML error to the NA sentinel (a str); numbers stay numbers, NA becomes null.
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
