"""The sampler's buffer, the export shape and the Prometheus text (fakeredis is enough here)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import fakeredis
import redis
from prometheus_client.parser import text_string_to_metric_families

from gswarm_tasks import names
from gswarm_tasks.profiling.nvml import FakeGpuSource
from gswarm_tasks.profiling.sampler import Sampler
from gswarm_web.control.sessions.prometheus import prometheus_text
from gswarm_web.profiling.export import export_document as _export_document
from gswarm_web.profiling.export import thin


def export_document(
    name: str, start: datetime, end: datetime | None, fr: Any, bandwidth: bool, nvlink: bool
) -> dict:
    head = {
        "session_name": name,
        "start_time": start.isoformat(),
        "end_time": end.isoformat() if end else None,
    }
    return _export_document(head, fr, bandwidth, nvlink)


def test_frames_are_buffered_while_redis_is_down_and_flushed_in_order() -> None:
    down = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, socket_timeout=0.2, retry=None)
    s = Sampler(down, "n1", 1.0, source=FakeGpuSource(2), buffer_size=5)
    for _ in range(7):
        s.step()
        s.sync()
    assert len(s.buffer) == 5 and s.dropped == 2  # bounded: the oldest go first
    up = fakeredis.FakeRedis()
    s.client = up
    assert s.flush()
    seqs = [json.loads(f[b"data"])["seq"] for _, f in up.xrange(names.frames_stream("n1"))]
    assert seqs == [3, 4, 5, 6, 7]
    assert not s.buffer


def test_sampler_follows_the_fastest_session_for_its_node() -> None:
    r = fakeredis.FakeRedis()
    r.hset(names.PROFILER_SESSIONS_KEY, "a", json.dumps({"freq_ms": 500, "nodes": []}))
    r.hset(names.PROFILER_SESSIONS_KEY, "b", json.dumps({"freq_ms": 100, "nodes": ["other"]}))
    s = Sampler(r, "n1", 1.0, source=FakeGpuSource(1))
    s.step()
    s.sync()
    assert s.period_s == 0.5
    r.hset(
        names.PROFILER_SESSIONS_KEY, "c", json.dumps({"freq_ms": 50, "nodes": ["n1"], "enable_nvlink": True})
    )
    s._next_sessions_check = 0
    s.step()
    s.sync()
    assert s.period_s == 0.1 and s.nvlink  # clamped to the 100 ms minimum


def frames(n: int, node: str = "n1", period: float = 0.1, gpus: int = 2) -> list[dict]:
    src = FakeGpuSource(gpus)
    return [
        {
            "node": node,
            "seq": i,
            "time": 1000 + i * period,
            "gpus": src.sample(True, False),
            "host": {
                "cpu_percent": float(i),
                "dram_percent": 50.0,
                "dram_used_bytes": 8 * 2**30,
                "disk_read_bytes_per_s": 1_000_000 * i,
                "disk_write_bytes_per_s": 2_000_000,
                "net_rx_bytes_per_s": 3_000_000,
                "net_tx_bytes_per_s": 4_000_000 + i,
            },
        }
        for i in range(n)
    ]


def test_export_shape_and_summaries() -> None:
    doc = export_document("s", datetime.now(UTC), None, frames(10), bandwidth=True, nvlink=False)
    assert set(doc) == {
        "session_name",
        "start_time",
        "end_time",
        "frames",
        "host_frames",
        "summary_by_device",
        "summary_by_node",
    }
    row = doc["frames"][0]
    assert set(row) == {
        "frame_id",
        "time",
        "gpu_id",
        "gpu_util",
        "gpu_memory",
        "pcie_rx_bytes_per_s",
        "pcie_tx_bytes_per_s",
    }
    assert row["gpu_id"] == "n1:0:Fake H100 80GB"
    assert len(doc["frames"]) == 20 and set(doc["summary_by_device"]) == {
        "n1:0:Fake H100 80GB",
        "n1:1:Fake H100 80GB",
    }
    cpu = doc["summary_by_node"]["n1"]["cpu_percent"]
    assert cpu == {"mean": 4.5, "max": 9.0, "p95": 9.0}
    assert len(list(thin(frames(10, period=0.1), 0.2))) == 5


def test_prometheus_text_parses_with_dcgm_names() -> None:
    frame = frames(1)[0]
    latest = {"node-a": frame}
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(latest))}
    util = families["DCGM_FI_DEV_GPU_UTIL"]
    assert len(util.samples) == 2
    assert util.samples[0].labels["hostname"] == "node-a" and util.samples[0].labels["gpu"] == "0"
    fb = families["DCGM_FI_DEV_FB_USED"].samples[0]
    assert fb.value == frame["gpus"][0]["memory_used_bytes"] / 2**20  # MiB, as DCGM reports it
    assert "gswarm_host_cpu_percent" in families and "DCGM_FI_DEV_POWER_USAGE" in families


def test_plot_is_a_valid_png_and_pdf_with_one_panel_per_view(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.image as mpimg

    from gswarm_web.profiling.plots import render

    doc = export_document("s", datetime.now(UTC), None, frames(30), bandwidth=True, nvlink=False)
    png, panels = render(doc, None, "png")
    # utilization, memory, bandwidth, heatmap; then the host's cpu, dram, disk, network
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and panels == 8
    (tmp_path / "p.png").write_bytes(png)
    height = mpimg.imread(tmp_path / "p.png").shape[0]
    assert height == int(2.6 * 8 * 100)  # 2.6 in per panel at 100 dpi
    spans = [{"label": "load @ n1:gpu0", "start": 1000.5, "end": 1001.5, "status": "succeeded"}]
    pdf, panels = render(doc, spans, "pdf")
    assert pdf[:5] == b"%PDF-" and panels == 9
    no_bw = export_document("s", datetime.now(UTC), None, frames(5), bandwidth=False, nvlink=False)
    assert render(no_bw, None, "png")[1] == 7


def test_analyze_cli_plots_an_export(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from gswarm_web.cli import main

    doc = export_document("s", datetime.now(UTC), None, frames(10), bandwidth=True, nvlink=False)
    (tmp_path / "s.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(
        main, ["profiler", "analyze", "--data", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.pdf")]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s.pdf").read_bytes()[:5] == b"%PDF-" and "8 panels" in r.output


def test_a_host_only_session_exports_host_frames_and_plots_host_panels() -> None:
    from gswarm_web.profiling.plots import panels_of, render

    doc = export_document("cpu", datetime.now(UTC), None, frames(12, gpus=0), bandwidth=True, nvlink=False)
    assert doc["frames"] == [] and len(doc["host_frames"]) == 12
    first = doc["host_frames"][1]
    assert first == {
        "frame_id": 1,
        "time": 1000.1,
        "node": "n1",
        "seq": 1,
        "cpu_percent": 1.0,
        "dram_used_bytes": 8 * 2**30,
        "dram_percent": 50.0,
        "disk_read_bytes_per_s": 1_000_000,
        "disk_write_bytes_per_s": 2_000_000,
        "net_rx_bytes_per_s": 3_000_000,
        "net_tx_bytes_per_s": 4_000_001,
    }
    node = doc["summary_by_node"]["n1"]
    assert node["frames"] == 12 and node["disk_read_bytes_per_s"]["max"] == 11_000_000
    assert doc["summary_by_device"] == {}
    spans = [{"label": "embed @ n1:cpu", "start": 1000.2, "end": 1000.9, "status": "succeeded"}]
    assert panels_of(doc, spans) == ["cpu", "dram", "disk", "network", "steps"]
    png, panels = render(doc, spans, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and panels == 5


def test_an_unsupported_field_is_absent_from_the_export_not_zero() -> None:
    f = frames(2)
    for fr in f:
        for g in fr["gpus"]:
            del g["pcie_tx_bytes_per_s"]  # what a GPU without that counter reports
    doc = export_document("s", datetime.now(UTC), None, f, bandwidth=True, nvlink=True)
    assert all(
        "pcie_tx_bytes_per_s" not in row and "nvlink_rx_bytes_per_s" not in row for row in doc["frames"]
    )
    assert all(row["pcie_rx_bytes_per_s"] > 0 for row in doc["frames"])
