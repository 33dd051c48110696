"""Imported profiling sessions (the original gswarm's, or a gswarm export from elsewhere): created `importing`,
their frames archived under the session's own name a request at a time, in time order per host, then finished
(`imported`, with summaries). An unfinished import of the same name starts over."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from gswarm_tasks.errors import Conflict, InvalidRequest, NotFound

from ...extensions import db
from ...tables import ProfilerFrameSegment, ProfilerSession
from . import archive as frame_archive
from .archive import Pos
from .state import keep_summary, summarize

MAX_SEQ_STEP = 1  # frames of one host at one millisecond take the next sequence number


def start_import(args: dict[str, Any]) -> ProfilerSession:
    """A session to import into; 409 when a session of that name exists and is not an unfinished import."""
    s = db.session.get(ProfilerSession, args["name"], with_for_update=True)
    if s is not None and s.state != "importing":
        raise Conflict(f"name: a session {args['name']!r} exists", {"field": "name", "status": s.state})
    if s is None:
        s = ProfilerSession(name=args["name"], request_time_info=[])
        db.session.add(s)
    db.session.execute(db.delete(ProfilerFrameSegment).where(ProfilerFrameSegment.session == s.name))
    s.state, s.freq_ms, s.nodes = "importing", args["freq_ms"], sorted(set(args["nodes"]))
    s.enable_bandwidth, s.enable_nvlink = args["enable_bandwidth"], args["enable_nvlink"]
    s.start_time, s.end_time = args["start_time"], args["end_time"]
    s.request_time_info = args["request_time_info"]
    s.frame_count = s.host_frame_count = s.summary_by_device = s.summary_by_node = None
    s.sealed_at = s.output_file = None
    db.session.commit()
    return s


def importing(name: str) -> ProfilerSession:
    """The import `name`, its row locked: one request of an import at a time."""
    s = db.session.get(ProfilerSession, name, with_for_update=True)
    if s is None:
        raise NotFound(f"no profiling session {name!r}", {"name": name})
    if s.state != "importing":
        raise Conflict(
            f"session {name} is {s.state}: frames are added to an import only (POST /profiler/imports first)",
            {"status": s.state},
        )
    return s


def _check(i: int, f: dict[str, Any], nodes: set[str]) -> None:
    where = f"frames[{i}]"
    if f["node"] not in nodes:
        raise InvalidRequest(
            f"{where}.node: {f['node']!r} is not one of the import's nodes", {"field": f"{where}.node"}
        )
    if not math.isfinite(f["time"]):
        raise InvalidRequest(f"{where}.time: not a time", {"field": f"{where}.time"})


def add_frames(name: str, frames: list[dict[str, Any]]) -> int:
    """Archive `frames` (each host's in time order, after what it already has); returns how many."""
    s = importing(name)
    by_node: dict[str, list[tuple[Pos, bytes]]] = defaultdict(list)
    last: dict[str, Pos | None] = {}
    for i, f in enumerate(frames):
        _check(i, f, set(s.nodes))
        node = f["node"]
        if node not in last:
            last[node] = frame_archive.last_archived(name, node)
        ms, prev = int(f["time"] * 1000), last[node]
        if prev is not None and ms < prev[0]:
            raise InvalidRequest(
                f"frames[{i}].time: frames of {node} go in time order (this one is before the one sent earlier)",
                {"field": f"frames[{i}].time"},
            )
        pos = (ms, prev[1] + MAX_SEQ_STEP) if prev is not None and ms == prev[0] else (ms, 0)
        last[node] = pos
        by_node[node].append((pos, json.dumps(f).encode()))
    for node, entries in by_node.items():
        if not frame_archive.add_segment(name, node, entries):
            raise Conflict(
                f"frames: {node}'s frames from {entries[0][0][0]} ms were already imported", {"node": node}
            )
    return len(frames)


def finish(name: str) -> ProfilerSession:
    """An import is done: its summaries from every frame; it reads like a stopped session from now on."""
    s = importing(name)
    keep_summary(s, summarize(s))
    s.state = "imported"
    db.session.commit()
    return s
