"""Profiling sessions: named time windows over the nodes' frames (their archive and streams), published to the
nodes' samplers while active; a window's frames at the session's own rate, its export (whole, a page at a time, or
into a file), its summaries, and imported sessions (frames archived under their own name)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from gswarm_tasks import names
from gswarm_tasks.errors import InvalidRequest, NotFound

from ...extensions import db, redis_client, settings
from ...profiling.export import DocumentWriter, Summary, export_document, rows
from ...profiling.original import ToOriginal, original_head
from ...tables import Node, ProfilerSession
from . import window as session_frames
from .archive import LIVE
from .window import Cursor, Source

Window = tuple[datetime, datetime]


def session_window(s: ProfilerSession, start: datetime | None = None, end: datetime | None = None) -> Window:
    """The part of a session asked for, clipped to [start_time, end_time] (now for an active session)."""
    lo, hi = s.start_time, s.end_time or datetime.now(UTC)
    if start is not None:
        lo = max(lo, start if start.tzinfo else start.replace(tzinfo=UTC))
    if end is not None:
        hi = min(hi, end if end.tzinfo else end.replace(tzinfo=UTC))
    if hi < lo:
        raise InvalidRequest(
            f"end: the window asked for ({lo.isoformat()} to {hi.isoformat()}) is empty or outside the session",
            {"field": "end", "start_time": s.start_time.isoformat()},
        )
    return lo, hi


def publish(s: ProfilerSession) -> None:
    """Tell the nodes' samplers about an active session: they read the hash when told, and every second."""
    doc = {
        "freq_ms": s.freq_ms,
        "nodes": s.nodes,
        "enable_bandwidth": s.enable_bandwidth,
        "enable_nvlink": s.enable_nvlink,
    }
    _announce(s.name, lambda pipe: pipe.hset(names.PROFILER_SESSIONS_KEY, s.name, json.dumps(doc)))


def unpublish(name: str) -> None:
    _announce(name, lambda pipe: pipe.hdel(names.PROFILER_SESSIONS_KEY, name))


def _announce(name: str, change: Callable[[Any], Any]) -> None:
    """A change of the sessions hash and its announcement to the nodes' samplers, in one MULTI."""
    client = redis_client()
    pipe = client.pipeline(transaction=True)
    change(pipe)
    pipe.publish(names.channel(names.PROFILER_SESSIONS_CHANNEL, client), name)
    pipe.execute()


def published() -> set[str]:
    raw: Any = redis_client().hkeys(names.PROFILER_SESSIONS_KEY)
    return {k.decode() if isinstance(k, bytes) else str(k) for k in raw}


def get_session(name: str) -> ProfilerSession:
    s = db.session.get(ProfilerSession, name)
    if s is None:
        raise NotFound(f"no profiling session {name!r}", {"name": name})
    return s


def session_nodes(s: ProfilerSession) -> list[str]:
    return list(s.nodes) or sorted(db.session.scalars(db.select(Node.name)))


def imported(s: ProfilerSession) -> bool:
    return s.state in ("importing", "imported")


def source(s: ProfilerSession) -> Source:
    """Where the session's frames are: the nodes' archive and streams at its own rate, or its own archive when
    imported (every frame: they are the session's as it was recorded)."""
    if imported(s):
        return Source(s.name, session_nodes(s), 0.0)
    return Source(LIVE, session_nodes(s), s.freq_ms / 1000)


def _client(s: ProfilerSession) -> redis.Redis | None:
    return None if imported(s) else redis_client()


def head(s: ProfilerSession) -> dict[str, Any]:
    return {
        "session_name": s.name,
        "start_time": s.start_time.isoformat(),
        "end_time": s.end_time.isoformat() if s.end_time else None,
    }


def frames_of(s: ProfilerSession, window: Window | None = None) -> Iterator[dict]:
    return session_frames.frames(_client(s), source(s), window or session_window(s))


def summarize(s: ProfilerSession, window: Window | None = None) -> Summary:
    """The summaries of the session (or of a window of it), from its frames as they stream by (no rows kept)."""
    summary = Summary()
    for f in frames_of(s, window):
        summary.add(f)
    return summary


def _bounded(frames: Iterator[dict], limit: int, window: Window) -> list[dict]:
    """The frames of a window, refused past `limit` readings (a GPU's or a host's) with how to ask for less."""
    kept: list[dict] = []
    readings = 0
    for f in frames:
        readings += 1 + len(f.get("gpus") or [])
        if readings > limit:
            raise InvalidRequest(
                f"window: {window[0].isoformat()} to {window[1].isoformat()} holds more than {limit:,} readings "
                "(profiling.export_max_readings); ask for a part of it with `start` and `end`",
                {"field": "window", "max_readings": limit, "reached": f.get("time")},
            )
        kept.append(f)
    return kept


def document(s: ProfilerSession, window: Window | None = None) -> dict[str, Any]:
    """The whole export document of a window (what a plot draws), at most profiling.export_max_readings readings."""
    window = window or session_window(s)
    kept = _bounded(frames_of(s, window), settings().profiling_export_max_readings, window)
    doc = export_document(head(s), kept, s.enable_bandwidth, s.enable_nvlink)
    doc["window"] = {"start": window[0].isoformat(), "end": window[1].isoformat()}
    return doc


def export_page(s: ProfilerSession, window: Window, cursor: str | None, whole: bool) -> dict[str, Any]:
    """One page of the export: at most profiling.export_max_readings readings from `cursor` on, `next_cursor` for
    the rest; the last page carries the summaries of the whole window (kept ones when it is the stopped session)."""
    src = source(s)
    at = Cursor.decode(cursor, src.nodes) if cursor else Cursor()
    kept, nxt = session_frames.page(_client(s), src, window, at, settings().profiling_export_max_readings)
    doc = export_document(head(s), kept, s.enable_bandwidth, s.enable_nvlink, first_fid=at.fid)
    doc["window"] = {"start": window[0].isoformat(), "end": window[1].isoformat()}
    doc["next_cursor"] = nxt.encode() if nxt else None
    if nxt is not None:
        doc["summary_by_device"] = doc["summary_by_node"] = None
    elif not (whole and s.state != "active" and s.summary_by_device is not None):
        summary = summarize(s, window)  # the whole window's, not this page's
        doc["summary_by_device"], doc["summary_by_node"] = summary.by_device(), summary.by_node()
    else:
        doc["summary_by_device"], doc["summary_by_node"] = s.summary_by_device, s.summary_by_node
    return doc


def stream_document(s: ProfilerSession, window: Window, tail: dict[str, Any]) -> Iterator[str]:
    """The whole export of a window as JSON text, piece by piece, from one read of its frames (host rows wait in a
    spool file while the GPU rows go out): no page, no bound, nothing of it held."""
    doc_head = {**head(s), "window": {"start": window[0].isoformat(), "end": window[1].isoformat()}}
    summary = Summary()
    with tempfile.SpooledTemporaryFile(max_size=8 << 20, mode="w+") as hosts:
        out = [json.dumps(doc_head)[:-1] + ',"frames":[']
        size, sep, host_sep = 0, "", ""
        for fid, f in enumerate(frames_of(s, window)):
            gpu_rows, host_row = rows(fid, f, s.enable_bandwidth, s.enable_nvlink)
            summary.add(f)
            for r in gpu_rows:
                out.append(sep + json.dumps(r))
                sep = ","
            hosts.write(host_sep + json.dumps(host_row))
            host_sep = ","
            size += 1
            if size % 1000 == 0:
                yield "".join(out)
                out = []
        yield "".join(out) + '],"host_frames":['
        hosts.seek(0)
        while chunk := hosts.read(1 << 20):
            yield chunk
    end = {
        "summary_by_device": summary.by_device(),
        "summary_by_node": summary.by_node(),
        "next_cursor": None,
    }
    yield "]," + json.dumps({**end, **tail})[1:]


def output_dir() -> Path:
    """Where a stopped session's `<name>.json` goes on the control plane: profiling.output_dir or
    $GSWARM_HOME/profiler."""
    cfg = settings()
    return (
        Path(cfg.profiling_output_dir).expanduser()
        if cfg.profiling_output_dir
        else Path(cfg.home) / "profiler"
    )


def write_file(s: ProfilerSession, path: Path, layout: str) -> tuple[Path, Summary]:
    """The session's export written to `path` as it is read (any length), in gswarm's or the original's layout;
    returns the path and the summaries of every frame."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    summary = Summary()
    if layout == "original":
        writer = DocumentWriter(path, original_head(head(s)), ["frames"])
        conv = ToOriginal(s.freq_ms / 1000, s.enable_bandwidth, s.enable_nvlink)
        for f in frames_of(s):
            writer.add("frames", conv.add(f))
            summary.add(f)
        writer.add("frames", conv.finish())
        return writer.close({"summary_by_device": conv.summary()}), summary
    writer = DocumentWriter(path, head(s), ["frames", "host_frames"])
    for fid, f in enumerate(frames_of(s)):
        gpu_rows, host_row = rows(fid, f, s.enable_bandwidth, s.enable_nvlink)
        writer.add("frames", gpu_rows)
        writer.add("host_frames", [host_row])
        summary.add(f)
    tail = {"summary_by_device": summary.by_device(), "summary_by_node": summary.by_node()}
    return writer.close({**tail, "request_time_info": s.request_time_info or []}), summary


def keep_summary(s: ProfilerSession, summary: Summary) -> None:
    s.frame_count, s.host_frame_count = summary.counts()
    s.summary_by_device, s.summary_by_node = summary.by_device(), summary.by_node()


def seal(s: ProfilerSession) -> None:
    """A stopped session whose frames are all archived: its summaries from every frame and its `<name>.json`."""
    path, summary = write_file(s, output_dir() / f"{s.name}.json", settings().profiling_output_format)
    keep_summary(s, summary)
    s.output_file, s.sealed_at = str(path), datetime.now(UTC)
