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


def _num(v: Any) -> int | float | None:
    # nvitop maps an NVML error to the NA sentinel (a str); numbers stay numbers, NA becomes null.
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v != "N/A" else None


_default: NvitopSource | None = None


def default_source() -> NvitopSource:
    global _default
    if _default is None:
        _default = NvitopSource()
    return _default


def list_gpus(source: GpuSource | None = None) -> list[dict[str, Any]]:
    """The GPUs of this host as plain dicts; [] when NVML is absent."""
    return (source or default_source()).gpus()
