"""The profiler's record on a real two-node fleet whose streams keep 60 frames (6 s at 10 Hz): a session longer than
that exports every frame it had, in order, once (checked against a reader of the streams that misses nothing); a
stop writes `<name>.json` where the CLI runs and on the control plane; the original's layout goes through export,
analyze, import and export again unchanged; the original's data directories come in with `gswarm import`; `gsprof`
runs gswarm's commands; and what a killed control worker leaves is listed, resumed and exported by `recover`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.original_data import original_frames, write_model_data, write_profiler_data
from tests.harness.procs import wait_for

GSWARM = [str(Path(sys.executable).with_name("gswarm"))]
GSPROF = [sys.executable, "-m", "gswarm_web.cli.original.gsprof"]
CAP = 60


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    env = {
        "GSWARM_FAKE_GPUS": "2",
        "GSWARM_PROFILING_STREAM_MAX_FRAMES": str(CAP),
        "GSWARM_PROFILING_ARCHIVE_INTERVAL": "1",
        "GSWARM_PROFILING_ARCHIVE_SEGMENT_FRAMES": "25",
        "GSWARM_PROFILING_EXPORT_MAX_READINGS": "600",
    }
    with running_fleet(tmp_path_factory.mktemp("archive"), extra_env=env) as f:
        f.cli_env = {**f.env, "GSWARM_API_URL": f.serve_http(), "GSWARM_TOKEN": f.token, "COLUMNS": "250"}  # type: ignore[attr-defined]
        yield f


def run(fleet: Fleet, argv: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, env=fleet.cli_env, cwd=cwd, capture_output=True, text=True, timeout=300)  # type: ignore[attr-defined]
    if ok:
        assert p.returncode == 0, f"{argv}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


class StreamReader:
    """Reads every entry of the nodes' streams as they come (polling faster than the cap drops them)."""

    def __init__(self, url: str, nodes: tuple[str, ...]) -> None:
        self.client = redis.Redis.from_url(url)
        self.last = {n: "$" for n in nodes}
        for n in nodes:
            newest: Any = self.client.xrevrange(names.frames_stream(n), count=1)
            self.last[n] = newest[0][0].decode() if newest else "0-0"
        self.frames: dict[str, list[tuple[int, dict[str, Any]]]] = {n: [] for n in nodes}  # (id's ms, frame)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            for n, last in self.last.items():
                page: Any = self.client.xrange(names.frames_stream(n), min=f"({last}", max="+")
                for eid, fields in page:
                    self.frames[n].append((int(eid.decode().split("-")[0]), json.loads(fields[b"data"])))
                    self.last[n] = eid.decode()
            self.stop.wait(0.2)

    def session(self, node: str, start: str, end: str, period_s: float) -> list[int]:
        """The seqs of the frames a session at `period_s` should have: inside its window (by stream id and by the
        frame's own time), one per period."""
        lo, hi = datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp()
        out, kept = [], None
        for ms, f in self.frames[node]:
            inside = int(lo * 1000) <= ms <= int(hi * 1000) and lo <= f["time"] <= hi
            if inside and (kept is None or f["time"] - kept >= 0.75 * period_s):
                out.append(f["seq"])
                kept = f["time"]
        return out


def seqs(doc: dict[str, Any], node: str) -> list[int]:
    return [r["seq"] for r in doc["host_frames"] if r["node"] == node]


def test_a_session_past_the_stream_cap_exports_every_frame_once_in_order(
    fleet: Fleet, tmp_path: Path
) -> None:
    reader = StreamReader(fleet.redis_url, ("node1", "node2"))
    code, s = fleet.post("/profiler/sessions", {"name": "marathon", "freq_ms": 100})
    assert code == 201, s
    client = redis.Redis.from_url(fleet.redis_url)

    def dropped_start() -> bool:  # the streams hold no frame of the session's first 20 s any more
        first: Any = client.xrange(names.frames_stream("node1"), count=1)
        return (
            bool(first)
            and json.loads(first[0][1][b"data"])["time"]
            > datetime.fromisoformat(s["start_time"]).timestamp() + 20
        )

    wait_for(dropped_start, 120, "node1's stream to drop the session's first 20 s")
    assert client.xlen(names.frames_stream("node1")) < 3 * CAP
    out = run(fleet, [*GSWARM, "profiler", "stop", "--name", "marathon"], tmp_path)
    assert "wrote marathon.json" in out.stdout
    sealed = wait_for(
        lambda: (b := fleet.get("/profiler/sessions/marathon")[1])["sealed_at"] and b, 30, "marathon sealed"
    )
    end_ms = int(datetime.fromisoformat(sealed["end_time"]).timestamp() * 1000)
    wait_for(
        lambda: all(int(v.split("-")[0]) > end_ms for v in reader.last.values()),
        10,
        "the reader past the end",
    )
    reader.stop.set()
    reader.thread.join(5)
    here = json.loads((tmp_path / "marathon.json").read_text())
    control = json.loads(Path(sealed["output_file"]).read_text())
    assert Path(sealed["output_file"]) == fleet.home / "profiler" / "marathon.json"
    for node in ("node1", "node2"):
        want = reader.session(node, sealed["start_time"], sealed["end_time"], 0.1)
        assert len(want) > 250
        assert seqs(control, node) == want  # every frame of the window, in order, once
        assert seqs(here, node) == want[: len(seqs(here, node))] and len(seqs(here, node)) >= len(want) - 3
    assert len(control["host_frames"]) == sealed["host_frame_count"]
    assert control["summary_by_device"] == sealed["summary_by_device"]
    assert [r["frame_id"] for r in here["host_frames"]] == list(range(len(here["host_frames"])))
    assert len(here["frames"]) == 2 * len(here["host_frames"])  # two GPUs a frame, pages put together


def test_the_original_layout_round_trips_through_export_analyze_and_import(
    fleet: Fleet, tmp_path: Path
) -> None:
    run(fleet, [*GSWARM, "profiler", "start", "--name", "rt", "--freq", "200"], tmp_path)
    wait_for(lambda: fleet.get("/profiler/sessions/rt")[1]["host_frame_count"] >= 40, 60, "40 frames of rt")
    run(fleet, [*GSWARM, "profiler", "stop", "--name", "rt", "--no-file"], tmp_path)
    wait_for(lambda: fleet.get("/profiler/sessions/rt")[1]["sealed_at"], 30, "rt sealed")
    run(
        fleet,
        [*GSWARM, "profiler", "export", "--name", "rt", "--format", "original", "--output", "o1.json"],
        tmp_path,
    )
    first = json.loads((tmp_path / "o1.json").read_text())
    assert [f["frame_id"] for f in first["frames"]] == list(range(1, len(first["frames"]) + 1))
    assert all(len(f["gpu_id"]) == 4 for f in first["frames"][2:])  # every GPU of both nodes in each frame
    assert set(first) == {"session_name", "start_time", "end_time", "frames", "summary_by_device"}
    out = run(
        fleet, [*GSWARM, "profiler", "analyze", "--data", "o1.json", "--plot", "o1.png"], tmp_path
    ).stdout
    assert "original layout" in out and (tmp_path / "o1.png").read_bytes()[:4] == b"\x89PNG"
    out = run(fleet, [*GSWARM, "import", "o1.json", "--name", "rt-again"], tmp_path).stdout
    assert "rt-again: imported" in out, out
    run(fleet, [*GSWARM, "profiler", "export", "--name", "rt-again", "--format", "original", "--output", "o2.json"],
        tmp_path)  # fmt: skip
    again = json.loads((tmp_path / "o2.json").read_text())
    assert again["frames"] == first["frames"] and again["summary_by_device"] == first["summary_by_device"]
    assert again["start_time"] == first["start_time"] and again["end_time"] == first["end_time"]
    # gswarm's own layout goes round the same way.
    run(fleet, [*GSWARM, "profiler", "export", "--name", "rt", "--output", "g1.json"], tmp_path)
    run(fleet, [*GSWARM, "import", "g1.json", "--name", "rt-g"], tmp_path)
    run(fleet, [*GSWARM, "profiler", "export", "--name", "rt-g", "--output", "g2.json"], tmp_path)
    g1, g2 = (json.loads((tmp_path / f).read_text()) for f in ("g1.json", "g2.json"))
    for key in ("frames", "host_frames", "summary_by_device", "summary_by_node", "start_time", "end_time"):
        assert g1[key] == g2[key], key
    out = run(fleet, [*GSWARM, "import", "g1.json", "--name", "rt-g"], tmp_path).stdout
    assert "rt-g: a session of that name exists, not imported" in out


def test_the_originals_data_directories_come_in(fleet: Fleet, tmp_path: Path) -> None:
    start = datetime(2024, 5, 1, 10, 0, 0)
    write_profiler_data(
        tmp_path / ".gswarm_profiler_data", {"training_run_1": 20, "week_long_training": 30}, start
    )
    write_model_data(tmp_path / ".gswarm_model_data", "node1")
    out = run(fleet, [*GSWARM, "import", ".gswarm_profiler_data", ".gswarm_model_data"], tmp_path).stdout
    assert "training_run_1: imported, 40 frames of 2 host(s), 3 GPUs" in out, out
    assert "week_long_training: imported, 60 frames of 2 host(s), 3 GPUs" in out, out  # the cut line left out
    assert "model tiny-gpt2: registered" in out and "model llama-7b: registered" in out
    assert "gpu-box-7:dram: node gpu-box-7 is not in the fleet, not recorded" in out
    # node1 has no copy of it: it looks, finds none, and nothing is recorded.
    assert "node1:disk: not recorded: " in out, out
    assert "model mystery: no source URL, not registered" in out
    code, model = fleet.get("/models/tiny-gpt2")
    assert code == 200 and model["metadata"]["description"] == "a tiny GPT-2" and model["locations"] == []
    code, s = fleet.get("/profiler/sessions/week_long_training")
    assert code == 200 and s["status"] == "imported" and s["host_frame_count"] == 60
    assert (
        datetime.fromisoformat(s["start_time"]).timestamp() == start.replace(hour=11).timestamp()
    )  # local time
    run(fleet, [*GSWARM, "profiler", "export", "--name", "training_run_1", "--format", "original", "--output",
                "t.json"], tmp_path)  # fmt: skip
    got = json.loads((tmp_path / "t.json").read_text())["frames"]
    want = original_frames(20, start)
    assert [f["frame_id"] for f in got] == [f["frame_id"] for f in want]
    for g, w in zip(got, want, strict=True):
        assert datetime.fromisoformat(g["time"]).timestamp() == w_time(w)
        assert g["gpu_id"] == w["gpu_id"]
        for key in ("gpu_util", "gpu_memory", "dram_bandwidth", "dram_bandwidth_rx", "dram_bandwidth_tx"):
            assert g[key] == [float(v) for v in w[key]], key


def w_time(frame: dict[str, Any]) -> float:
    return datetime.fromisoformat(frame["time"]).timestamp()


def test_start_without_a_name_report_and_gsprof(fleet: Fleet, tmp_path: Path) -> None:
    out = run(fleet, [*GSWARM, "profiler", "start", "--freq", "500", "--node", "node2"], tmp_path).stdout
    name = out.split()[1]
    assert name.startswith("session_") and len(name) == len("session_20260101_120000"), out
    wait_for(lambda: fleet.get(f"/profiler/sessions/{name}")[1]["host_frame_count"] >= 4, 30, "4 frames")
    run(fleet, [*GSWARM, "profiler", "stop", "--name", name, "--no-file"], tmp_path)
    out = run(fleet, [*GSWARM, "profiler", "report"], tmp_path).stdout
    assert name in out and "mean util %" in out
    out = run(fleet, [*GSWARM, "profiler", "report", "--name", name], tmp_path).stdout
    assert "node2:0:Fake H100 80GB" in out and "node1:0" not in out and "CPU mean" in out
    # gsprof, as the original's README has it: a session, its stop (the original's <name>.json), its statistics.
    run(
        fleet,
        [*GSPROF, "start", "--name", "data_loading_phase", "--freq", "200", "--enable-bandwidth"],
        tmp_path,
    )
    wait_for(
        lambda: fleet.get("/profiler/sessions/data_loading_phase")[1]["host_frame_count"] >= 10,
        30,
        "10 frames",
    )
    (tmp_path / "data_loading_phase.json").write_text("mine")  # a file of that name is there: it is kept
    kept = run(fleet, [*GSPROF, "stop", "--name", "data_loading_phase"], tmp_path, ok=False)
    assert kept.returncode == 1 and "--force" in kept.stderr and "nothing was stopped" in kept.stderr, kept
    assert (tmp_path / "data_loading_phase.json").read_text() == "mine"
    assert fleet.get("/profiler/sessions/data_loading_phase")[1]["status"] == "active"
    run(fleet, [*GSPROF, "stop", "--name", "data_loading_phase", "--force"], tmp_path)
    doc = json.loads((tmp_path / "data_loading_phase.json").read_text())
    assert doc["frames"][0]["frame_id"] == 1 and "dram_bandwidth_rx" in doc["frames"][0]
    out = run(
        fleet,
        [*GSPROF, "stat", "--data", "data_loading_phase.json", "--plot", "data_loading_phase.pdf"],
        tmp_path,
    )
    assert (tmp_path / "data_loading_phase.pdf").read_bytes()[:5] == b"%PDF-", out.stdout
    p = run(fleet, [*GSPROF, "http-profile", "master-node:8091", "--name", "x"], tmp_path, ok=False)
    assert p.returncode == 2 and "gswarm profiler start --name x" in p.stderr


def test_recover_after_the_control_worker_dies(fleet: Fleet, tmp_path: Path) -> None:
    """Last in this module: it kills the control worker (and starts it again)."""
    code, _ = fleet.post("/profiler/sessions", {"name": "crash", "freq_ms": 200, "nodes": ["node1"]})
    assert code == 201

    def listed() -> dict[str, Any]:
        return next(r for r in fleet.get("/profiler/recover")[1] if r["name"] == "crash")

    wait_for(lambda: listed()["archived_frames"] > 0, 30, "crash archived")
    fleet.procs["control"].kill_group()
    fleet.procs["control"].proc.wait(10)  # type: ignore[union-attr]
    row = wait_for(
        lambda: (r := listed())["interrupted"] and r["pending_frames"] > 10 and r, 30, "crash interrupted"
    )
    assert "no archiver (control worker) running" in row["interrupted"][0]
    assert row["frames"] == row["archived_frames"] + row["pending_frames"] and row["published"]
    redis.Redis.from_url(fleet.redis_url).hdel(names.PROFILER_SESSIONS_KEY, "crash")  # Redis lost it too
    out = run(fleet, [*GSWARM, "profiler", "recover", "--list"], tmp_path).stdout
    assert "crash" in out and "not published" in out and "no archiver" in out
    before = listed()["frames"]
    out = run(fleet, [*GSWARM, "profiler", "recover", "--name", "crash"], tmp_path).stdout
    assert "resumed crash" in out
    row = listed()
    assert row["published"] and row["archived_frames"] >= before
    assert redis.Redis.from_url(fleet.redis_url).hexists(names.PROFILER_SESSIONS_KEY, "crash")
    out = run(
        fleet, [*GSWARM, "profiler", "recover", "--export", "crash.json", "--name", "crash"], tmp_path
    ).stdout
    doc = json.loads((tmp_path / "crash.json").read_text())
    assert len(doc["host_frames"]) >= before - 2 and "wrote crash.json" in out
    fleet.start("control", "control", app_module="gswarm_web.celery_app")
    code, _ = fleet.post("/profiler/sessions/crash/stop", {})
    assert code == 200
    sealed = wait_for(
        lambda: (b := fleet.get("/profiler/sessions/crash")[1])["sealed_at"] and b, 30, "crash sealed"
    )
    assert sealed["host_frame_count"] >= len(doc["host_frames"])
    assert not [r for r in fleet.get("/profiler/recover")[1] if r["name"] == "crash"]
