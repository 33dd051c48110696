"""Sessions a stopped control plane left behind, and resuming them. Sessions live in the database, so a restart
loses none: what a dead control plane leaves undone is the nodes' instructions (Redis lost the published session,
so they sample at the default rate) and the archive (frames wait in the nodes' bounded streams until the control
worker's archiver takes them, and a stopped session waits to be sealed)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from gswarm_tasks import names

from ...extensions import db, redis_client, settings
from ...tables import ProfilerSession
from . import window as session_frames
from .archive import archive_node
from .archiver import ALIVE_FIELD
from .state import published, session_nodes, session_window, source

STALE_S = 5.0  # the archiver goes round every second: this long without it, it is not running


def archiver_seen_s() -> float | None:
    seen: Any = redis_client().hget(names.METRICS_SEEN_KEY, ALIVE_FIELD)
    return round(time.time() - float(seen), 3) if seen else None


def recoverable() -> list[dict[str, Any]]:
    """Every active session, and every stopped one not sealed yet, with what keeps it from going on by itself."""
    pub, age = published(), archiver_seen_s()
    rows = db.session.scalars(
        db.select(ProfilerSession)
        .where(
            db.or_(
                ProfilerSession.state == "active",
                db.and_(ProfilerSession.state == "stopped", ProfilerSession.sealed_at.is_(None)),
            )
        )
        .order_by(ProfilerSession.start_time)
    )
    out = []
    for s in rows:
        interrupted = []
        if s.state == "active" and s.name not in pub:
            interrupted.append("not published: its nodes do not sample at its rate")
        if age is None or age > STALE_S:
            interrupted.append(
                "no archiver (control worker) running: its frames wait in the nodes' bounded streams"
            )
        counts = session_frames.counts(redis_client(), source(s), session_window(s))
        out.append(
            {
                "name": s.name,
                "status": s.state,
                "start_time": s.start_time,
                "end_time": s.end_time,
                "nodes": session_nodes(s),
                "published": s.name in pub,
                "archiver_seen_s": age,
                "interrupted": interrupted,
                **counts,
            }  # fmt: skip
        )
    return out


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def resume_archive(s: ProfilerSession) -> int:
    """Archive every frame of the session's nodes now (what a control worker would have done); returns how many."""
    most = max(1, settings().profiling_archive_segment_frames)
    return sum(archive_node(redis_client(), n, _ms(s.start_time), 0, most, True) for n in session_nodes(s))
