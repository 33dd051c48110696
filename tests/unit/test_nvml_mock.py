"""GPU sampling through the real path (nvml.py -> nvitop -> pynvml -> libnvidia-ml.so.1) with the mock library.

NVML is loaded once per process, so every scenario runs in a Python process of its own that answers commands on
stdin with one JSON line each.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from tests.harness.nvml_mock import LIBRARY_NAME, build_library, device, library_env, write_config

REPO = Path(__file__).resolve().parents[2]
GONE_PID = 4_194_399  # above the kernel's largest possible pid_max (2**22), so no process can have it
MiB, GiB = 1024**2, 1024**3

DRIVER = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
from gswarm_tasks.profiling.nvml import default_source, list_gpus
source = default_source()
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "gpus":
        out = list_gpus()
    elif cmd[0] == "sample":
        out = source.sample(cmd[1] == "bandwidth", cmd[2] == "nvlink")
    elif cmd[0] == "retry-at-once":
        source.retry_after_s = 0.0
        out = None
    print(json.dumps(out), flush=True)
"""


class Sampler:
    """One process sampling its GPUs through nvml.py, with the mock library loaded from `lib_dir`."""

    def __init__(self, lib_dir: Path, config: Path, stderr: Path) -> None:
        self.stderr_path = stderr
        self._stderr = stderr.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER],
            cwd=REPO,
            env=library_env(lib_dir, config),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )

    def ask(self, command: str, timeout_s: float = 60.0) -> Any:
        stdin, stdout = self._pipes()
        stdin.write(command + "\n")
        stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                raise TimeoutError(
                    f"no answer to {command!r} in {timeout_s} s; stderr: {self.stderr_path.read_text()}"
                )
        line = stdout.readline()
        if not line:
            raise RuntimeError(
                f"the sampler exited ({self.proc.wait()}); stderr: {self.stderr_path.read_text()}"
            )
        return json.loads(line)

    def sample(self, bandwidth: bool = True, nvlink: bool = False) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.ask(
            f"sample {'bandwidth' if bandwidth else '-'} {'nvlink' if nvlink else '-'}"
        )
        return rows

    def finish(self) -> str:
        """Stop the process and return what it wrote on stderr."""
        if self.proc.poll() is None:
            self._pipes()[0].close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.stderr_path.read_text()

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout


@pytest.fixture(scope="session")
def mock_lib_dir(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(
        pytestconfig, "cache", None
    )  # kept between runs, so the library is compiled once per source
    root = Path(cache.mkdir("nvml-mock")) if cache is not None else tmp_path_factory.mktemp("nvml-mock")
    return build_library(root).parent


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tmp_path / "nvml.json"


@pytest.fixture
def start(mock_lib_dir: Path, config: Path, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Sampler]]:
    started: list[Sampler] = []

    def start(doc: dict[str, Any]) -> Sampler:
        write_config(config, doc)
        s = Sampler(mock_lib_dir, config, tmp_path / f"stderr-{len(started)}.txt")
        started.append(s)
        return s

    yield start
    for s in started:
        s.finish()


def test_the_library_is_compiled_once_per_source(mock_lib_dir: Path) -> None:
    lib = mock_lib_dir / LIBRARY_NAME
    built_at = lib.stat().st_mtime_ns
    assert build_library(mock_lib_dir.parent) == lib
    assert lib.stat().st_mtime_ns == built_at


def test_the_node_announces_its_gpus_with_names_and_memory(start: Callable[..., Sampler]) -> None:
    s = start(
        {
            "devices": [
                device(0, memory_used_bytes=3 * GiB, utilization_gpu_percent=42, temperature_c=51),
                device(1, name="NVIDIA A100-SXM4-40GB", memory_total_bytes=40 * GiB, temperature_c=38),
            ]
        }
    )
    assert s.ask("gpus") == [
        {
            "index": 0,
            "uuid": "GPU-00000000-0000-4000-8000-000000000000",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 80 * GiB,
            "memory_used_bytes": 3 * GiB,
            "utilization_percent": 42,
            "temperature_c": 51,
        },
        {
            "index": 1,
            "uuid": "GPU-00000001-0000-4000-8000-000000000000",
            "name": "NVIDIA A100-SXM4-40GB",
            "memory_total_bytes": 40 * GiB,
            "memory_used_bytes": 0,
            "utilization_percent": 0,
            "temperature_c": 38,
        },
    ]
    assert s.finish() == ""  # nothing nvitop asked for was missing from the library


def test_a_frame_carries_the_files_values_in_gswarm_units(start: Callable[..., Sampler]) -> None:
    s = start(
        {
            "devices": [
                device(
                    0,
                    memory_used_bytes=20 * GiB,
                    utilization_gpu_percent=87,
                    temperature_c=64,
                    power_usage_mw=512_345,
                    sm_clock_mhz=1980,
                    memory_clock_mhz=2619,
                    pcie_rx_kib_per_s=12_000_000,  # host -> GPU
                    pcie_tx_kib_per_s=3_000_000,
                )
            ]
        }
    )
    expected = {
        "index": 0,
        "uuid": "GPU-00000000-0000-4000-8000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_percent": 87,
        "memory_used_bytes": 20 * GiB,
        "memory_total_bytes": 80 * GiB,
        "memory_percent": 25.0,
        "temperature_c": 64,
        "power_w": 512.345,
        "sm_clock_mhz": 1980,
        "memory_clock_mhz": 2619,
        "processes": [],
    }
    assert s.sample(bandwidth=False) == [expected]
    assert s.sample(bandwidth=True) == [
        {**expected, "pcie_rx_bytes_per_s": 12_000_000 * 1024, "pcie_tx_bytes_per_s": 3_000_000 * 1024}
    ]
    assert s.finish() == ""


def test_a_changed_file_shows_in_the_next_frame_of_the_same_process(
    start: Callable[..., Sampler], config: Path
) -> None:
    s = start({"devices": [device(0, utilization_gpu_percent=10, power_usage_mw=100_000)]})
    (before,) = s.sample()
    assert (before["utilization_percent"], before["power_w"]) == (10, 100.0)

    write_config(config, {"devices": [device(0, utilization_gpu_percent=95, power_usage_mw=650_000)]})
    (after,) = s.sample()
    assert (after["utilization_percent"], after["power_w"]) == (95, 650.0)

    write_config(config, {"devices": [device(0, utilization_gpu_percent=96, power_usage_mw=650_000)]})
    (again,) = s.sample()  # same size, within the same mtime tick: still seen
    assert again["utilization_percent"] == 96
    assert s.finish() == ""


def test_a_broken_file_keeps_the_last_good_values_and_says_why(
    start: Callable[..., Sampler], config: Path
) -> None:
    s = start({"devices": [device(0, utilization_gpu_percent=33)]})
    assert s.sample()[0]["utilization_percent"] == 33
    write_config(config, {"devices": [device(0, utilization_gpu_percnt=1)]})
    assert s.sample()[0]["utilization_percent"] == 33
    assert "utilization_gpu_percnt: unknown key" in s.finish()


def test_an_unsupported_reading_is_absent_not_zero(start: Callable[..., Sampler]) -> None:
    unsupported = ["utilization", "temperature", "power_usage", "sm_clock", "pcie_tx", "processes"]
    s = start({"devices": [device(0, pcie_rx_kib_per_s=5, not_supported=unsupported), device(1)]})
    partial, full = s.sample(bandwidth=True)
    missing = {
        "utilization_percent",
        "temperature_c",
        "power_w",
        "sm_clock_mhz",
        "pcie_tx_bytes_per_s",
        "processes",
    }
    assert missing <= set(full)
    assert not missing & set(partial)
    assert partial["pcie_rx_bytes_per_s"] == 5 * 1024 and partial["memory_clock_mhz"] == 2619
    announced = s.ask("gpus")[0]
    assert "utilization_percent" not in announced and "temperature_c" not in announced
    assert announced["memory_total_bytes"] == 80 * GiB
    assert s.finish() == ""


def test_nvlink_appears_only_when_asked_for_and_up(start: Callable[..., Sampler], config: Path) -> None:
    def links(*rates: tuple[bool, int, int]) -> list[dict[str, Any]]:
        return [{"active": up, "rx_kib_per_s": rx, "tx_kib_per_s": tx} for up, rx, tx in rates]

    up = links((True, 10_000_000, 20_000_000), (True, 5_000_000, 1_000_000), (False, 7_000_000, 7_000_000))
    doc = {
        "devices": [
            device(0, nvlink=up),
            device(1, nvlink=links((True, 1, 1)), not_supported=["nvlink"]),
            device(2, nvlink=links((False, 9, 9), (False, 9, 9))),
            device(3, nvlink=[]),
        ]
    }
    s = start(doc)
    nvlink_keys = {"nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s"}
    assert all(not nvlink_keys & set(row) for row in s.sample(nvlink=False))

    rows = s.sample(nvlink=True)
    # counters are whole KiB, so a rate over a short interval is exact to a few parts per million
    assert rows[0]["nvlink_rx_bytes_per_s"] == pytest.approx(15_000_000 * 1024, rel=1e-3)
    assert rows[0]["nvlink_tx_bytes_per_s"] == pytest.approx(21_000_000 * 1024, rel=1e-3)
    assert all(not nvlink_keys & set(row) for row in rows[1:])

    doc["devices"][0]["nvlink"][0]["rx_kib_per_s"] = 30_000_000
    write_config(config, doc)
    assert s.sample(nvlink=True)[0]["nvlink_rx_bytes_per_s"] == pytest.approx(35_000_000 * 1024, rel=1e-3)
    assert s.finish() == ""


def test_per_process_memory_names_the_process(start: Callable[..., Sampler]) -> None:
    child = subprocess.Popen(["sleep", "300"])
    try:
        processes = [
            {"pid": child.pid, "used_gpu_memory_bytes": 2 * GiB},
            {"pid": GONE_PID, "used_gpu_memory_bytes": 64 * MiB},
            {"pid": os.getpid(), "used_gpu_memory_bytes": None, "type": "graphics"},
        ]
        s = start({"devices": [device(0, processes=processes), device(1)]})
        first, second = s.sample()
        assert {p["pid"]: p for p in first["processes"]} == {
            child.pid: {"pid": child.pid, "name": "sleep", "gpu_memory_bytes": 2 * GiB},
            GONE_PID: {"pid": GONE_PID, "gpu_memory_bytes": 64 * MiB},  # no such process: no name
            os.getpid(): {"pid": os.getpid(), "name": psutil.Process().name()},  # memory not available
        }
        assert second["processes"] == []
        assert s.finish() == ""
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("error", ["DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND", "NO_PERMISSION"])
def test_a_library_that_fails_to_start_gives_no_gpus_and_one_log_line(
    start: Callable[..., Sampler], error: str
) -> None:
    s = start({"init_error": error, "devices": [device(0)]})
    assert s.ask("retry-at-once") is None  # every call below tries NVML again
    for _ in range(3):
        assert s.ask("gpus") == []
        assert s.sample(bandwidth=True, nvlink=True) == []
    lines = s.finish().splitlines()
    assert len(lines) == 1, lines
    assert "no NVIDIA GPUs visible on this host" in lines[0]
    assert "".join(part.title() for part in error.split("_")) in lines[0]  # NVMLError_DriverNotLoaded, ...
