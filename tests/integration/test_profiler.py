"""Profiling on real workers with fake GPUs: frequency, overlapping windows, a Redis outage, /metrics."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from gswarm_tasks import names
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for


def until(seconds: float) -> None:
    """Let a measured window pass (the test measures a rate over it; it waits on nothing else)."""
    end = time.monotonic() + seconds
    wait_for(lambda: time.monotonic() >= end, seconds + 5, f"a {seconds} s window", interval=0.05)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(
        tmp_path_factory.mktemp("prof"),
        # A bound the longer session of the export test exceeds: frames of node1 carry 2 GPUs, 3 readings a frame.
        extra_env={"GSWARM_FAKE_GPUS": "2", "GSWARM_PROFILING_EXPORT_MAX_READINGS": "240"},
        nodes=("node1",),
    ) as f:
        yield f


def test_overlapping_sessions_each_get_their_frequency_and_window(fleet: Fleet) -> None:
    code, a = fleet.post("/profiler/sessions", {"name": "a", "freq_ms": 200, "nodes": ["node1"]})
    assert code == 201, a
    until(3)
    code, b = fleet.post("/profiler/sessions", {"name": "b", "freq_ms": 100, "nodes": ["node1"]})
    until(3)
    fleet.post("/profiler/sessions/b/stop", {})
    until(4)
    code, a_stopped = fleet.post("/profiler/sessions/a/stop", {})
    assert code == 200 and a_stopped["status"] == "stopped"
    ea = fleet.get("/profiler/sessions/a/export")[1]
    eb = fleet.get("/profiler/sessions/b/export")[1]
    b_info = fleet.get("/profiler/sessions/b")[1]
    from datetime import datetime

    def window(doc: dict[str, Any]) -> tuple[float, float]:
        return datetime.fromisoformat(doc["start_time"]).timestamp(), datetime.fromisoformat(
            doc["end_time"]
        ).timestamp()

    for doc in (ea, eb):
        lo, hi = window(doc)
        assert all(lo - 0.01 <= f["time"] <= hi + 0.01 for f in doc["frames"]), doc["session_name"]
        assert {f["gpu_id"] for f in doc["frames"]} == {"node1:0:Fake H100 80GB", "node1:1:Fake H100 80GB"}
    lo, hi = window(ea)
    expected_a = (hi - lo) / 0.2
    assert abs(a_stopped["frame_count"] - expected_a) <= 0.1 * expected_a, (
        a_stopped["frame_count"],
        expected_a,
    )
    lo, hi = window(eb)
    expected_b = (hi - lo) / 0.1
    assert abs(b_info["frame_count"] - expected_b) <= 0.1 * expected_b, (b_info["frame_count"], expected_b)
    dev = a_stopped["summary_by_device"]["node1:0:Fake H100 80GB"]
    assert 0 <= dev["gpu_util"]["mean"] <= 100 and dev["gpu_util"]["max"] >= dev["gpu_util"]["mean"]
    assert "pcie_rx_bytes_per_s" in ea["frames"][0]
    r = fleet.client.get("/api/v1/profiler/sessions/a/plot?format=png", headers=fleet.auth())
    # four GPU panels and four host panels, and the steps when a workflow ran meanwhile
    assert r.status_code == 200 and r.data[:4] == b"\x89PNG" and r.headers["X-Panels"] in ("8", "9")
    r = fleet.client.get("/api/v1/profiler/sessions/a/plot?format=pdf", headers=fleet.auth())
    assert r.status_code == 200 and r.data[:5] == b"%PDF-"
    assert (
        fleet.client.get("/api/v1/profiler/sessions/a/plot?format=gif", headers=fleet.auth()).status_code
        == 422
    )


def test_metrics_latest_and_prometheus(fleet: Fleet) -> None:
    latest = wait_for(lambda: fleet.get("/metrics/latest")[1]["nodes"].get("node1"), 10, "a frame of node1")
    assert latest["age_s"] < 3 and len(latest["gpus"]) == 2
    r = fleet.client.get("/api/v1/metrics", headers=fleet.auth())
    assert r.status_code == 200 and r.mimetype == "text/plain"
    families = {f.name: f for f in text_string_to_metric_families(r.get_data(as_text=True))}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert {s.labels["gpu"] for s in util} == {"0", "1"} and {s.labels["hostname"] for s in util} == {"node1"}
    assert families["gswarm_host_cpu_percent"].samples[0].labels["hostname"] == "node1"
    assert fleet.client.get("/api/v1/metrics").status_code == 401
    root = fleet.client.get("/metrics", headers=fleet.auth())  # where Prometheus looks by default
    assert (
        root.status_code == 200 and root.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    )
    families = {f.name: f for f in text_string_to_metric_families(root.get_data(as_text=True))}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert {(s.labels["instance"], s.labels["gpu"]) for s in util} == {("node1", "0"), ("node1", "1")}
    assert set(util[0].labels) >= {"gpu", "UUID", "device", "modelName", "hostname"}


def test_session_refusals(fleet: Fleet) -> None:
    assert fleet.post("/profiler/sessions", {"name": "fast", "freq_ms": 50})[0] == 422
    assert fleet.post("/profiler/sessions", {"name": "x", "nodes": ["ghost"]})[0] == 404
    assert fleet.post("/profiler/sessions", {"name": "../x"})[0] == 422


def test_export_pages_and_plot_read_only_their_window_and_are_bounded(fleet: Fleet) -> None:
    from datetime import datetime, timedelta

    code, _ = fleet.post("/profiler/sessions", {"name": "long", "freq_ms": 100, "nodes": ["node1"]})
    assert code == 201
    wait_for(
        lambda: fleet.get("/profiler/sessions/long")[1]["host_frame_count"] >= 90, 60, "90 frames of node1"
    )
    code, stopped = fleet.post("/profiler/sessions/long/stop", {})
    assert code == 200 and stopped["host_frame_count"] >= 90  # a stop streams its summary: never refused
    sealed = wait_for(
        lambda: (b := fleet.get("/profiler/sessions/long")[1])["sealed_at"] and b, 30, "long sealed"
    )
    # The export comes in pages of at most 240 readings (80 frames of 2 GPUs and a host), the summaries last.
    pages, host_rows, gpu_rows, cursor = [], [], [], None
    while True:
        code, page = fleet.get(
            "/profiler/sessions/long/export", query_string={"cursor": cursor} if cursor else {}
        )
        assert code == 200, page
        pages.append(page)
        assert len(page["frames"]) + len(page["host_frames"]) <= 240
        host_rows += page["host_frames"]
        gpu_rows += page["frames"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert page["summary_by_device"] is None
    assert len(pages) >= 2 and len(host_rows) == sealed["host_frame_count"]
    assert [r["frame_id"] for r in host_rows] == list(range(len(host_rows)))
    assert pages[-1]["summary_by_device"] == sealed["summary_by_device"]
    assert len(gpu_rows) == 2 * len(host_rows)
    r = fleet.client.get("/api/v1/profiler/sessions/long/export?all=true", headers=fleet.auth())
    whole = r.get_json()
    assert r.status_code == 200 and whole["host_frames"] == host_rows and whole["frames"] == gpu_rows
    assert whole["summary_by_device"] == sealed["summary_by_device"]  # the same from every frame
    code, body = fleet.get("/profiler/sessions/long/export", query_string={"cursor": "bogus"})
    assert code == 422 and body["error"]["details"]["field"] == "cursor"
    code, body = fleet.get("/profiler/sessions/long/plot")
    assert code == 422, body
    assert body["error"]["details"]["field"] == "window" and "start` and `end" in body["error"]["message"]
    lo = datetime.fromisoformat(stopped["start_time"]) + timedelta(seconds=2)
    hi = lo + timedelta(seconds=3)
    window = {"start": lo.isoformat(), "end": hi.isoformat()}
    code, part = fleet.get("/profiler/sessions/long/export", query_string=window)
    assert code == 200, part
    assert part["window"] == window and part["session_name"] == "long" and part["next_cursor"] is None
    times = {f["time"] for f in part["frames"]} | {f["time"] for f in part["host_frames"]}
    assert times and lo.timestamp() <= min(times) and max(times) <= hi.timestamp()
    assert 25 <= len(part["host_frames"]) <= 32, len(part["host_frames"])  # 10 a second
    r = fleet.client.get("/api/v1/profiler/sessions/long/plot", query_string=window, headers=fleet.auth())
    assert r.status_code == 200 and r.data[:4] == b"\x89PNG"
    before = {"end": (datetime.fromisoformat(stopped["start_time"]) - timedelta(seconds=1)).isoformat()}
    code, body = fleet.get("/profiler/sessions/long/export", query_string=before)
    assert code == 422 and body["error"]["details"]["field"] == "end", body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_redis_outage_leaves_no_gap_in_the_frames(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    argv = [
        shutil.which("redis-server") or "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
    ]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "the dedicated redis")
    f = Fleet(tmp_path / "fleet", redis_url=url, extra_env={"GSWARM_FAKE_GPUS": "1"})
    try:
        f.start("control", "control", app_module="gswarm_web.celery_app")
        f.start_node("node1")
        assert f.post("/profiler/sessions", {"name": "outage", "freq_ms": 200, "nodes": ["node1"]})[0] == 201
        until(2)
        server.terminate()
        server.wait(10)
        until(10)  # the node keeps sampling into its buffer
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "redis back")
        until(3)
        code, stopped = f.post("/profiler/sessions/outage/stop", {})
        assert code == 200, stopped
        times = sorted({fr["time"] for fr in f.get("/profiler/sessions/outage/export")[1]["frames"]})
        steady = [t for t in times if t > times[0] + 0.5]  # the node learns of a new session within 0.1 s
        gaps = [b - a for a, b in zip(steady, steady[1:], strict=False)]
        assert max(gaps) < 0.6, max(gaps)  # no hole where Redis was down
        assert times[-1] - times[0] > 13
    finally:
        f.close()
        server.terminate()
        server.wait(10)


def _redis_server(port: int, data: Path) -> subprocess.Popen[bytes]:
    argv = [
        shutil.which("redis-server") or "redis-server",
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)),
        *("--appendonly", "yes", "--appendfsync", "always", "--save", ""),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _spilled(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["frame"])
        except ValueError:
            continue
    return out


def test_frames_of_an_outage_survive_a_node_restart_and_arrive_once_in_order(tmp_path: Path) -> None:
    """Redis goes down; the node spills its frames to disk; the node worker is killed; Redis and the node come
    back: every spilled frame reaches its stream, once, in order, inside the session; a node whose spill file is
    full counts what it dropped."""
    port = free_port()
    (tmp_path / "redis").mkdir()
    server = _redis_server(port, tmp_path / "redis")
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "the dedicated redis")
    f = Fleet(tmp_path / "fleet", redis_url=url, extra_env={"GSWARM_FAKE_GPUS": "1"})
    try:
        f.start("control", "control", app_module="gswarm_web.celery_app")
        f.start_node("node1")
        f.start_node("node2", GSWARM_PROFILING_SPILL_MAX_BYTES="3000")
        assert f.post("/profiler/sessions", {"name": "spill", "freq_ms": 200})[0] == 201
        until(2)
        server.terminate()
        server.wait(10)
        spill = f.storage("node1") / ".frames-spill.jsonl"
        wait_for(lambda: len(_spilled(spill)) >= 15, 30, "15 frames spilled by node1")
        f.procs["node1"].kill_group()  # SIGKILL: nothing of it survives but what is on disk
        f.procs["node1"].proc.wait(10)  # type: ignore[union-attr]
        spilled = _spilled(spill)
        assert [fr["seq"] for fr in spilled] == sorted(fr["seq"] for fr in spilled)
        server = _redis_server(port, tmp_path / "redis")
        wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "redis back")
        f.start_node("node1")
        wait_for(lambda: not spill.exists(), 30, "the spill file replayed and removed")
        entries = redis.Redis.from_url(url).xrange(names.frames_stream("node1"))
        frames = [json.loads(e[b"data"]) for _, e in entries]
        stamps = [(fr["seq"], fr["time"]) for fr in frames]
        for fr in spilled:
            assert stamps.count((fr["seq"], fr["time"])) == 1, fr["seq"]  # once
        times = [fr["time"] for fr in frames]
        assert times == sorted(times) and len(set(times)) == len(times)  # in order, no duplicate
        code, stopped = f.post("/profiler/sessions/spill/stop", {})
        assert code == 200, stopped
        exported = {fr["time"] for fr in f.get("/profiler/sessions/spill/export")[1]["host_frames"]}
        assert {fr["time"] for fr in spilled} <= exported  # the outage's frames are inside the session
        node2 = wait_for(
            lambda: (n := f.get("/nodes/node2")[1])["frames_dropped"] > 0 and n, 30, "node2's drops"
        )
        assert node2["frames_dropped"] > 0 and f.get("/nodes/node1")[1]["frames_dropped"] == 0
    finally:
        f.close()
        server.terminate()
        server.wait(10)
