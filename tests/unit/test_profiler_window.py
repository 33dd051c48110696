"""A session's frames: its window only (stream ids bound the read, frame times bound what is kept), from the archive
and then the stream past it, every frame once whatever the stream dropped; pages that put together are the whole;
a plot's window past the bound is refused with how to ask for less. SQLite and fakeredis are enough here."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
from flask import Flask

from gswarm_tasks import names
from gswarm_tasks.errors import InvalidRequest
from gswarm_web.control.sessions import archive as frame_archive
from gswarm_web.control.sessions.archive import LIVE, archive_node
from gswarm_web.control.sessions.state import _bounded
from gswarm_web.control.sessions.window import STREAM_PAGE, Cursor, Source, counts, frames, page
from gswarm_web.profiling.export import Summary, thin

T0 = datetime(2030, 1, 1, tzinfo=UTC).timestamp()


def frame(t: float, gpus: int = 2, node: str = "n1", seq: int = 0) -> dict:
    readings = [{"index": i, "name": "G", "utilization_percent": 50.0} for i in range(gpus)]
    host = {"cpu_percent": 10.0, "extra": "dropped"}
    return {"node": node, "seq": seq, "time": t, "gpus": readings, "host": host, "x": 1}


def fill(r: Any, node: str, n: int, step_s: float = 0.1, gpus: int = 2) -> None:
    pipe = r.pipeline()
    for i in range(n):
        t = T0 + i * step_s
        pipe.xadd(
            names.frames_stream(node), {"data": json.dumps(frame(t, gpus, node, i))}, id=f"{int(t * 1000)}-0"
        )
    pipe.execute()


def window(seconds: float) -> tuple[datetime, datetime]:
    return datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + seconds, UTC)


def test_only_frames_inside_the_window_are_read(app: Flask) -> None:
    r = fakeredis.FakeRedis()
    lo, hi = window(10)
    # Entries by stream id (Redis time) before, inside and after the window; one inside whose frame time is not
    # (a frame a node kept through an outage and sent later).
    for offset, frame_time in ((-5, -5), (1, 1), (2, 2), (3, -100), (4, 4), (11, 11)):
        r.xadd(
            names.frames_stream("n1"),
            {"data": json.dumps(frame(T0 + frame_time))},
            id=f"{int((T0 + offset) * 1000)}-0",
        )
    got = list(frames(r, Source(LIVE, ["n1"], 0.001), (lo, hi)))
    assert [f["time"] - T0 for f in got] == [1, 2, 4]
    assert set(got[0]) == {"time", "node", "host", "gpus", "seq"} and got[0]["host"] == {"cpu_percent": 10.0}


def test_reads_page_through_long_streams_and_thin_to_the_session_rate(app: Flask) -> None:
    r = fakeredis.FakeRedis()
    fill(r, "n1", STREAM_PAGE + 50, gpus=0)  # 10 a second
    w = window(2000)
    assert len(list(frames(r, Source(LIVE, ["n1"], 0.1), w))) == STREAM_PAGE + 50
    assert len(list(frames(r, Source(LIVE, ["n1"], 0.2), w))) == (STREAM_PAGE + 50) // 2  # every other frame
    assert len(list(thin(frames(r, Source(LIVE, ["n1"], 0.1), w), 0.2))) == (STREAM_PAGE + 50) // 2


def test_frames_the_stream_dropped_come_from_the_archive_every_one_once_in_order(app: Flask) -> None:
    r = fakeredis.FakeRedis()
    fill(r, "n1", 500)
    # Archived in segments of 120 as the control worker would (frames 10 s old and more: all here), then the node's
    # cap drops all but the newest 80 frames from its stream; 20 more arrive that nobody archived yet.
    assert archive_node(r, "n1", int(T0 * 1000), 0, 120, force=False) == 500
    r.xtrim(names.frames_stream("n1"), maxlen=80)
    pipe = r.pipeline()
    for i in range(500, 520):
        t = T0 + i * 0.1
        pipe.xadd(
            names.frames_stream("n1"), {"data": json.dumps(frame(t, 2, "n1", i))}, id=f"{int(t * 1000)}-0"
        )
    pipe.execute()
    got = list(frames(r, Source(LIVE, ["n1"], 0.1), window(100)))
    assert [f["seq"] for f in got] == list(range(520))
    assert counts(r, Source(LIVE, ["n1"], 0.1), window(100)) == {
        "frames": 520,
        "archived_frames": 500,
        "pending_frames": 20,
    }
    # A second archiver (or a stop) that read the same frames writes nothing twice.
    assert archive_node(r, "n1", int(T0 * 1000), 0, 120, force=True) == 20
    assert archive_node(r, "n1", int(T0 * 1000), 0, 120, force=True) == 0
    entries = list(frame_archive.read(LIVE, "n1", frame_archive.before_ms(0), 2**62))
    assert len(entries) == 520 and [e[0] for e in entries] == sorted(e[0] for e in entries)
    blob = frame_archive.encode([((1, 0), b"{}")])
    assert frame_archive.add_segment(LIVE, "n1", [((1, 0), b"{}")]) and blob
    assert not frame_archive.add_segment(LIVE, "n1", [((1, 0), b"{}"), ((2, 0), b"{}")])


def test_young_frames_wait_unless_forced(app: Flask) -> None:
    r = fakeredis.FakeRedis()
    now = r.time()
    t = now[0] + now[1] / 1e6
    r.xadd(names.frames_stream("n1"), {"data": json.dumps(frame(t))}, id=f"{int(t * 1000)}-0")
    assert archive_node(r, "n1", 0, 60_000, 100, force=False) == 0  # a minute to go
    assert archive_node(r, "n1", 0, 60_000, 100, force=True) == 1


def test_pages_put_together_are_the_whole_window(app: Flask) -> None:
    r = fakeredis.FakeRedis()
    fill(r, "n1", 300)
    fill(r, "n2", 300, step_s=0.1, gpus=1)
    archive_node(r, "n1", 0, 0, 64, force=False)  # one node half archived, half streamed
    r.xtrim(names.frames_stream("n1"), maxlen=150)
    src = Source(LIVE, ["n1", "n2"], 0.1)
    whole = [(f["node"], f["seq"]) for f in frames(r, src, window(60))]
    assert len(whole) == 600
    cursor: Cursor | None = Cursor()
    got: list[tuple[str, int]] = []
    pages = 0
    while cursor is not None:
        out, cursor = page(r, src, window(60), Cursor.decode(cursor.encode(), src.nodes), 100)
        assert sum(1 + len(f["gpus"]) for f in out) <= 100
        got += [(f["node"], f["seq"]) for f in out]
        pages += 1
    assert got == whole and pages > 10
    with pytest.raises(InvalidRequest, match="cursor"):
        Cursor.decode("not-a-cursor", src.nodes)
    with pytest.raises(InvalidRequest, match="cursor"):
        Cursor.decode(Cursor(0, {"elsewhere": (1, 0, 1.0)}).encode(), src.nodes)


def test_a_plot_window_past_the_bound_is_refused_and_summaries_need_no_rows() -> None:
    fr = [frame(1000.0 + i) for i in range(10)]  # 3 readings each
    w = (datetime.fromtimestamp(1000, UTC), datetime.fromtimestamp(1010, UTC))
    assert len(_bounded(iter(fr), 30, w)) == 10
    with pytest.raises(InvalidRequest, match="more than 29 readings .* `start` and `end`"):
        _bounded(iter(fr), 29, w)
    summary = Summary()
    for f in fr:
        summary.add(f)
    assert summary.counts() == (10, 10)
    assert summary.by_device()["n1:0:G"] == {
        "samples": 10,
        "gpu_util": {"mean": 50.0, "max": 50.0, "p95": 50.0},
        "gpu_memory": {"mean": None, "max": None, "p95": None},
    }


def test_window_before_the_session_is_refused() -> None:
    from types import SimpleNamespace

    from gswarm_web.control.sessions.state import session_window

    s: Any = SimpleNamespace(start_time=datetime.fromtimestamp(T0, UTC), end_time=None)
    with pytest.raises(InvalidRequest, match="end"):
        session_window(s, end=datetime.fromtimestamp(T0, UTC) - timedelta(seconds=1))
