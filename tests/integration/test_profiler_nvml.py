"""The sampling path as it runs on a GPU host: a real node worker -> nvml.py -> nvitop -> libnvidia-ml.so.1, with
the library replaced by the test's mock (tests/harness/nvml_mock) whose values the test writes and changes while the
node runs. The node announces the file's GPUs; frames carry its values in gswarm's units; NVLink appears only when a
session asks for it and a link is up; a process holding GPU memory is named; an unsupported reading is absent;
a library that fails to start gives a node without GPUs and one log line, and the worker keeps running."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness.fleet import Fleet, running_fleet
from tests.harness.nvml_mock import CONFIG_ENV, build_library, device, write_config
from tests.harness.procs import wait_for

GIB = 1024**3
A100 = "NVIDIA A100-SXM4-40GB"


def _doc(util: int = 37, links_up: bool = True) -> dict[str, Any]:
    return {
        "devices": [
            device(
                0,
                memory_used_bytes=10 * GIB,
                utilization_gpu_percent=util,
                temperature_c=61,
                power_usage_mw=312_500,
                pcie_rx_kib_per_s=1_000,
                pcie_tx_kib_per_s=250,
                nvlink=[{"active": links_up, "rx_kib_per_s": 4_000, "tx_kib_per_s": 2_000}] * 2,
                processes=[{"pid": os.getpid(), "used_gpu_memory_bytes": 3 * GIB, "type": "compute"}],
            ),
            device(
                1,
                name=A100,
                memory_total_bytes=40 * GIB,
                memory_used_bytes=1 * GIB,
                utilization_gpu_percent=5,
                not_supported=["power_usage", "temperature", "nvlink"],
            ),
        ]
    }


@pytest.fixture(scope="module")
def library(pytestconfig: pytest.Config) -> Path:
    return build_library(Path(pytestconfig.cache.mkdir("nvml-mock")))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, library: Path) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("nvml")
    good, broken = tmp / "nvml.json", tmp / "nvml-broken.json"
    write_config(good, _doc())
    write_config(broken, {"init_error": "DRIVER_NOT_LOADED"})
    with running_fleet(tmp, nodes=()) as f:
        lib_path = os.pathsep.join(
            p for p in (str(library.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        f.start_node("node1", LD_LIBRARY_PATH=lib_path, **{CONFIG_ENV: str(good)})
        f.start_node("node2", LD_LIBRARY_PATH=lib_path, **{CONFIG_ENV: str(broken)})
        f.config = good  # type: ignore[attr-defined]
        yield f


def _gpus(fleet: Fleet, node: str = "node1") -> dict[int, dict[str, Any]]:
    frame = fleet.get("/metrics/latest")[1]["nodes"].get(node) or {}
    return {g["index"]: g for g in frame.get("gpus") or []}


def test_the_node_announces_the_librarys_gpus(fleet: Fleet) -> None:
    node = wait_for(lambda: (n := fleet.get("/nodes/node1")[1]).get("gpus") and n, 30, "node1's GPUs")
    gpus = sorted(node["gpus"], key=lambda g: g["index"])
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3", A100]
    assert [g["memory_total_bytes"] for g in gpus] == [80 * GIB, 40 * GIB]
    assert gpus[0]["uuid"] == "GPU-00000000-0000-4000-8000-000000000000"


def test_frames_carry_the_files_values_in_gswarms_units(fleet: Fleet) -> None:
    fleet.post(
        "/profiler/sessions", {"name": "bw", "freq_ms": 200, "nodes": ["node1"], "enable_bandwidth": True}
    )
    try:
        gpus = wait_for(
            lambda: (g := _gpus(fleet)) and "pcie_rx_bytes_per_s" in g.get(0, {}) and g, 30, "a frame"
        )
        g0, g1 = gpus[0], gpus[1]
        assert g0["utilization_percent"] == 37
        assert g0["memory_used_bytes"] == 10 * GIB and g0["memory_total_bytes"] == 80 * GIB
        assert g0["temperature_c"] == 61 and g0["power_w"] == 312.5
        assert g0["pcie_rx_bytes_per_s"] == 1_000 * 1024  # rx: host -> GPU, KiB/s -> bytes/s
        assert g0["pcie_tx_bytes_per_s"] == 250 * 1024
        # an unsupported reading is absent, never 0 or null
        assert "power_w" not in g1 and "temperature_c" not in g1
        assert g1["utilization_percent"] == 5 and g1["memory_used_bytes"] == 1 * GIB
        # the process holding memory on gpu0 is named
        (proc,) = g0["processes"]
        assert proc["pid"] == os.getpid() and proc["gpu_memory_bytes"] == 3 * GIB
        assert proc["name"] == psutil.Process().name()
        # NVLink was not asked for: absent
        assert not any(k.startswith("nvlink") for g in gpus.values() for k in g)
        # the file changes while the node runs: the next frames follow
        write_config(fleet.config, _doc(util=88))  # type: ignore[attr-defined]
        wait_for(lambda: _gpus(fleet).get(0, {}).get("utilization_percent") == 88, 30, "the new utilisation")
    finally:
        fleet.post("/profiler/sessions/bw/stop", {})


def test_nvlink_appears_only_when_asked_and_a_link_is_up(fleet: Fleet) -> None:
    fleet.post(
        "/profiler/sessions", {"name": "nv", "freq_ms": 200, "nodes": ["node1"], "enable_nvlink": True}
    )
    try:
        gpus = wait_for(
            lambda: (g := _gpus(fleet)) and "nvlink_rx_bytes_per_s" in g.get(0, {}) and g, 30, "NVLink"
        )
        # two links up at 4,000 / 2,000 KiB/s each; the rate is measured from counters, so allow a little drift
        assert abs(gpus[0]["nvlink_rx_bytes_per_s"] - 2 * 4_000 * 1024) <= 0.05 * 2 * 4_000 * 1024
        assert abs(gpus[0]["nvlink_tx_bytes_per_s"] - 2 * 2_000 * 1024) <= 0.05 * 2 * 2_000 * 1024
        assert not any(k.startswith("nvlink") for k in gpus[1])  # its NVLink is not supported
        write_config(fleet.config, _doc(links_up=False))  # type: ignore[attr-defined]
        wait_for(
            lambda: "nvlink_rx_bytes_per_s" not in _gpus(fleet).get(0, {"x": 1}),
            30,
            "NVLink gone, links down",
        )
    finally:
        fleet.post("/profiler/sessions/nv/stop", {})
        write_config(fleet.config, _doc())  # type: ignore[attr-defined]


def test_a_library_that_fails_to_start_gives_a_node_without_gpus_and_one_log_line(fleet: Fleet) -> None:
    node = wait_for(
        lambda: (n := fleet.get("/nodes/node2")[1]).get("status") == "healthy" and n, 30, "node2 up"
    )
    assert node["gpus"] == []
    seen = node["last_seen"]
    wait_for(
        lambda: fleet.get("/nodes/node2")[1]["last_seen"] != seen, 30, "another heartbeat"
    )  # still alive
    log = fleet.procs["node2"].log()
    assert log.count("no NVIDIA GPUs visible on this host") == 1, log[-3000:]
    assert "Driver Not Loaded" in log
    assert fleet.procs["node2"].proc is not None and fleet.procs["node2"].proc.poll() is None


def test_a_session_on_the_node_without_gpus_records_its_host(fleet: Fleet) -> None:
    """A host-only session: no GPU frames, host frames in the export with a per-node summary, host panels drawn."""
    from gswarm_web.profiling.plots import panels_of

    code, body = fleet.post("/profiler/sessions", {"name": "host", "freq_ms": 200, "nodes": ["node2"]})
    assert code == 201, body
    wait_for(
        lambda: (fleet.get("/profiler/sessions/host")[1].get("host_frame_count") or 0) >= 5, 30, "host frames"
    )
    code, stopped = fleet.post("/profiler/sessions/host/stop", {})
    assert code == 200 and stopped["frame_count"] == 0 and stopped["host_frame_count"] >= 5, stopped
    doc = fleet.get("/profiler/sessions/host/export")[1]
    assert doc["frames"] == [] and len(doc["host_frames"]) == stopped["host_frame_count"]
    assert {f["node"] for f in doc["host_frames"]} == {"node2"}
    assert all(0 <= f["cpu_percent"] <= 100 and f["dram_used_bytes"] > 0 for f in doc["host_frames"])
    assert doc["summary_by_node"]["node2"]["frames"] == len(doc["host_frames"])
    assert panels_of(doc, []) == ["cpu", "dram", "disk", "network"]
    r = fleet.client.get("/api/v1/profiler/sessions/host/plot?format=png", headers=fleet.auth())
    assert r.status_code == 200 and r.data[:8] == b"\x89PNG\r\n\x1a\n"
