"""The control worker's archiver: once a second, every node that an active session covers (or a stopped one not yet
sealed) has the frames of its stream that waited profiling.archive_interval archived; a session stopped more than
GRACE_S ago has every frame of its nodes archived, then is sealed: its summaries from every frame and its
`<name>.json` in the output directory. A thread of the worker's main process, beside the frames consumer."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import redis
from flask import Flask

from gswarm_tasks import names

from ...extensions import db, settings
from ...tables import ProfilerSession
from .archive import archive_node
from .state import seal, session_nodes

log = logging.getLogger(__name__)

GRACE_S = 2.0  # frames sampled before a stop may reach the stream this long after it
ALIVE_FIELD = "archiver"  # in names.METRICS_SEEN_KEY: when the archiver last went round


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def covered() -> tuple[dict[str, int], set[str], list[str]]:
    """Nodes to archive (from the earliest start of a session covering them), the nodes to archive whole now, and
    the stopped sessions due for sealing."""
    now = datetime.now(UTC)
    due = db.session.scalars(
        db.select(ProfilerSession).where(
            db.or_(
                ProfilerSession.state == "active",
                db.and_(ProfilerSession.state == "stopped", ProfilerSession.sealed_at.is_(None)),
            )
        )
    )
    start: dict[str, int] = {}
    force: set[str] = set()
    sealing: list[str] = []
    for s in due:
        nodes = session_nodes(s)
        for n in nodes:
            start[n] = min(start.get(n, _ms(s.start_time)), _ms(s.start_time))
        if s.state == "stopped" and s.end_time is not None and now >= s.end_time + timedelta(seconds=GRACE_S):
            force.update(nodes)
            sealing.append(s.name)
    db.session.rollback()  # end the read: archiving commits a segment at a time
    return start, force, sealing


def seal_one(name: str) -> bool:
    """Seal `name` unless another archiver holds or did it."""
    s = db.session.execute(
        db.select(ProfilerSession)
        .where(
            ProfilerSession.name == name,
            ProfilerSession.sealed_at.is_(None),
            ProfilerSession.state == "stopped",
        )
        .with_for_update(skip_locked=True)
    ).scalar_one_or_none()
    if s is None:
        db.session.rollback()
        return False
    try:
        seal(s)
        db.session.commit()
    except BaseException:
        db.session.rollback()
        raise
    log.info("profiling session %s sealed: %s frames, written to %s", name, s.host_frame_count, s.output_file)
    return True


def tick(client: redis.Redis) -> int:
    """One round: archive what is due, seal what stopped; returns frames archived."""
    cfg = settings()
    start, force, sealing = covered()
    done = 0
    for node, since in sorted(start.items()):
        done += archive_node(
            client,
            node,
            since,
            cfg.profiling_archive_interval_s * 1000,
            max(1, cfg.profiling_archive_segment_frames),
            node in force,
        )
    for name in sealing:
        seal_one(name)
    client.hset(names.METRICS_SEEN_KEY, ALIVE_FIELD, time.time())
    return done


class Archiver:
    """Runs `tick` once a second on a thread of its own, inside the Flask app."""

    def __init__(self, app: Flask, client: redis.Redis, period_s: float = 1.0) -> None:
        self.app, self.client, self.period_s = app, client, period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                with self.app.app_context():
                    try:
                        tick(self.client)
                    finally:
                        db.session.remove()
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("profiler archiver failing, will retry: %s", exc, exc_info=True)
                failing = True
            self._stop.wait(self.period_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gswarm-archiver", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
