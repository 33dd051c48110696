"""The original's file layout both ways, its sessions directory read back, `analyze` on either layout, and `gsprof`:
the commands that exist run gswarm's, the gRPC era's say what to type now and exit 2."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gswarm_web.cli import main
from gswarm_web.cli.original.gsprof import main as gsprof
from gswarm_web.cli.profiler_files import read_export
from gswarm_web.profiling.original import (
    ToOriginal,
    epoch,
    from_original,
    is_original,
    read_jsonl,
    saved_sessions,
    to_original,
)
from tests.harness.original_data import original_frames, write_profiler_data

HEAD = {"session_name": "s", "start_time": "2030-01-01T00:00:00+00:00", "end_time": None}


def node_frames(n: int, nodes: tuple[str, ...] = ("n1", "n2"), period: float = 1.0) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        for k, node in enumerate(nodes):  # nodes sample on clocks of their own: 0.3 s apart
            gpus = [
                {
                    "index": g,
                    "name": "Fake H100 80GB",
                    "utilization_percent": float((i + g) % 100),
                    "memory_percent": 12.3456,
                    "pcie_rx_bytes_per_s": 1_234_567_890 + g,
                    "pcie_tx_bytes_per_s": 5e8,
                    "nvlink_rx_bytes_per_s": 2e9,
                    "nvlink_tx_bytes_per_s": 1e9,
                }  # fmt: skip
                for g in range(2)
            ]
            out.append({"node": node, "time": 1000.0 + i * period + 0.3 * k, "gpus": gpus, "host": {}})
    return out


def test_one_frame_per_sample_time_across_all_gpus_in_the_originals_units() -> None:
    doc = to_original(HEAD, node_frames(5), 1.0, bandwidth=True, nvlink=True)
    frames = doc["frames"]
    assert [f["frame_id"] for f in frames] == [1, 2, 3, 4, 5]
    assert all(len(f["gpu_id"]) == 4 for f in frames)  # both nodes' GPUs in every frame
    assert frames[0]["gpu_id"] == ["n1:0:Fake H100 80GB", "n1:1:Fake H100 80GB", "n2:0:Fake H100 80GB",
                                   "n2:1:Fake H100 80GB"]  # fmt: skip
    f = frames[2]
    assert f["gpu_util"] == [2.0, 3.0, 2.0, 3.0] and f["gpu_memory"] == [12.35] * 4  # percent, two decimals
    assert f["dram_bandwidth_rx"][0] == 1.23 and f["dram_bandwidth_tx"][0] == 0.5  # GB/s
    assert f["dram_bandwidth"][0] == 1.73 and f["gpu_bandwidth"] == [3.0] * 4  # NVLink rx + tx per GPU, GB/s
    assert epoch(f["time"]) == pytest.approx(1002.3)  # the time of the frame's last reading
    assert doc["summary_by_device"]["n1:0:Fake H100 80GB"] == {"avg_gpu_util": 2.0, "avg_gpu_memory": 12.35}
    assert set(doc) == {"session_name", "start_time", "end_time", "frames", "summary_by_device"}
    assert is_original(doc)


def test_original_frames_read_back_and_write_again_the_same() -> None:
    first = to_original(HEAD, node_frames(20), 1.0, bandwidth=True, nvlink=True)
    again = to_original(HEAD, from_original(first["frames"]), 1.0, bandwidth=True, nvlink=True)
    assert again == first
    conv = ToOriginal(1.0, False, False)
    out = [x for f in node_frames(3, nodes=("n1",)) for x in conv.add(f)] + conv.finish()
    assert len(out) == 3 and "dram_bandwidth" not in out[0]


def test_the_originals_own_frames_read_as_gswarm_frames() -> None:
    t0 = datetime(2024, 5, 1, 10, 0, 0)
    frames = original_frames(4, t0)
    got = list(from_original(frames))
    assert [f["node"] for f in got[:2]] == ["gpu-box-a", "gpu-box-b"]
    a = got[0]
    assert a["time"] == t0.timestamp()  # naive: local time, as the original wrote it
    assert a["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA A100-SXM4-80GB",
        "utilization_percent": 20.0,
        "memory_percent": 8.25,
        "pcie_rx_bytes_per_s": 2_500_000_000,
        "pcie_tx_bytes_per_s": 750_000_000,
    }
    with pytest.raises(ValueError, match=r"frames\[0\]"):
        list(from_original([{"time": "x"}]))


def test_a_saved_sessions_directory_reads_back(tmp_path: Path) -> None:
    ids = write_profiler_data(
        tmp_path, {"training_run": 5, "week_long_training": 7}, datetime(2024, 5, 1, 10)
    )
    found = {state["name"]: path for state, path in saved_sessions(tmp_path)}
    assert set(found) == {"training_run", "week_long_training"}
    assert found["training_run"] == tmp_path / ids["training_run"] / "frames.jsonl"
    assert len(list(read_jsonl(found["training_run"]))) == 5
    assert (
        len(list(read_jsonl(found["week_long_training"]))) == 7
    )  # the line cut short by the crash is left out


def test_analyze_reads_both_layouts(tmp_path: Path) -> None:
    frames = original_frames(30, datetime(2024, 5, 1, 10))
    (tmp_path / "training_run_1.json").write_text(json.dumps({"frames": frames, "summary_by_device": {}}))
    r = CliRunner().invoke(
        main,
        [
            "profiler",
            "analyze",
            "--data",
            str(tmp_path / "training_run_1.json"),
            "--plot",
            str(tmp_path / "o.pdf"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "original layout" in r.output and "gpu-box-b:0:NVIDIA H100 80GB HBM3: util mean" in r.output
    assert (tmp_path / "o.pdf").read_bytes()[
        :5
    ] == b"%PDF-" and "(4 panels)" in r.output  # util, memory, PCIe, heat
    doc, layout = read_export(tmp_path / "training_run_1.json")
    assert layout == "original" and len(doc["frames"]) == 90 and doc["period_s"] == 1.0
    (tmp_path / "bad.json").write_text(json.dumps({"no": "frames"}))
    r = CliRunner().invoke(
        main, ["profiler", "analyze", "--data", str(tmp_path / "bad.json"), "--plot", "x.png"]
    )
    assert r.exit_code == 2 and "not a profiler export" in r.output


@pytest.mark.parametrize(
    ("argv", "now"),
    [
        (["start", "--port", "8090", "--http-port", "8091", "--enable-bandwidth", "--freq", "1000"],
         "gswarm host start --port 8090 --http-port 8091` (the head), then `gswarm profiler start --freq 1000 "
         "--enable-bandwidth"),
        (["connect", "master-node:8090", "--resilient"], "gswarm client connect master-node:8090 --resilient"),
        (["profile", "master-node:8090", "--name", "my_experiment"], "gswarm profiler start --name my_experiment"),
        (["http-profile", "master-node:8091", "--name", "training_run_1"],
         "gswarm profiler start --name training_run_1"),
        (["http-status", "localhost:8091"], "gswarm profiler status"),
        (["http-stop", "master-node:8091", "--name", "training_run_1"], "gswarm profiler stop --name training_run_1"),
    ],
)  # fmt: skip
def test_gsprof_commands_of_the_grpc_era_say_what_to_type_now(argv: list[str], now: str) -> None:
    r = CliRunner().invoke(gsprof, argv)
    assert r.exit_code == 2 and r.output.strip() == f"gsprof: this is now `{now}`", r.output


def test_gsprof_commands_that_exist_are_gswarms(tmp_path: Path) -> None:
    frames = original_frames(5, datetime(2024, 5, 1, 10))
    (tmp_path / "my_experiment.json").write_text(json.dumps({"frames": frames}))
    r = CliRunner().invoke(
        gsprof, ["stat", "--data", str(tmp_path / "my_experiment.json"), "--plot", str(tmp_path / "m.pdf")]
    )
    assert r.exit_code == 0 and (tmp_path / "m.pdf").exists(), r.output
    helps = {
        c: CliRunner().invoke(gsprof, [c, "--help"]).output for c in ("recover", "stop", "status", "start")
    }
    assert (
        "--session-id" in helps["recover"] and "--export" in helps["recover"] and "--list" in helps["recover"]
    )
    assert "ADDRESS" in helps["stop"] and "--name" in helps["stop"]
    r = CliRunner().invoke(gsprof, ["recover", "--export"])
    assert r.exit_code == 2 and "--export needs --name" in r.output


def test_gpus_keep_their_place_whichever_node_samples_first_and_a_late_node_comes_last() -> None:
    early = node_frames(3, nodes=("n2", "n1"))  # n2 samples before n1 here
    late = [f for f in node_frames(6, nodes=("n0",)) if f["time"] >= 1003.0]
    frames = sorted(early + late, key=lambda f: f["time"])
    doc = to_original(HEAD, frames, 1.0, bandwidth=False, nvlink=False)
    first, last = doc["frames"][0]["gpu_id"], doc["frames"][-1]["gpu_id"]
    assert first == [
        "n1:0:Fake H100 80GB",
        "n1:1:Fake H100 80GB",
        "n2:0:Fake H100 80GB",
        "n2:1:Fake H100 80GB",
    ]
    assert last[:4] == first and last[4:] == ["n0:0:Fake H100 80GB", "n0:1:Fake H100 80GB"]
    again = to_original(HEAD, sorted(from_original(doc["frames"]), key=lambda f: (f["time"], f["node"])), 1.0,
                        bandwidth=False, nvlink=False)  # fmt: skip
    assert again["frames"] == doc["frames"]
