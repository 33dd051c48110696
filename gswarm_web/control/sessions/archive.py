"""The profiler's archive: frames kept in the database, in stream order, as zstd-compressed segments of JSON lines
(`<ms>-<seq>\\t<frame>`), so a session outlives its nodes' bounded streams.

A node's stream is archived (`session` "") while a session covers the node, from the earliest such session's start;
each segment begins after the last archived stream id, and its key is its first id, so two archivers (or a stop and
the control worker) can never archive a frame twice: the second insert of a segment conflicts and is dropped.
An imported session's frames are archived under its own name. Why the database rather than files: the API and the
control worker read and write it from any host (compose runs them apart), transactions keep a segment whole, and a
backup of Postgres is a backup of the profiles.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
import zstandard
from sqlalchemy.exc import IntegrityError

from gswarm_tasks import names

from ...extensions import db
from ...tables import ProfilerFrameSegment

log = logging.getLogger(__name__)

Pos = tuple[int, int]  # a stream id: (milliseconds, sequence)
MAXSEQ = 2**63 - 1  # (ms - 1, MAXSEQ) is just before every id of millisecond ms
LIVE = ""  # the `session` of a node's stream archive
BATCH = 16  # segments read per query


def parse_id(eid: Any) -> Pos:
    text = eid.decode() if isinstance(eid, bytes) else str(eid)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def before_ms(ms: int) -> Pos:
    """The position just before the first id of millisecond `ms`."""
    return ms - 1, MAXSEQ


def exclusive(after: Pos) -> str:
    """XRANGE's lower bound for the ids after `after`."""
    return "-" if after[0] < 0 else f"({after[0]}-{after[1]}"


def encode(entries: list[tuple[Pos, bytes]]) -> bytes:
    lines = b"\n".join(b"%d-%d\t%s" % (ms, seq, data) for (ms, seq), data in entries)
    return zstandard.ZstdCompressor(level=3).compress(lines)


def decode(blob: bytes) -> Iterator[tuple[Pos, bytes]]:
    for line in zstandard.ZstdDecompressor().decompress(blob).split(b"\n"):
        head, _, data = line.partition(b"\t")
        yield parse_id(head), data


def last_archived(session: str, node: str) -> Pos | None:
    row = db.session.execute(
        db.select(ProfilerFrameSegment.last_ms, ProfilerFrameSegment.last_seq)
        .where(ProfilerFrameSegment.session == session, ProfilerFrameSegment.node == node)
        .order_by(ProfilerFrameSegment.last_ms.desc(), ProfilerFrameSegment.last_seq.desc())
        .limit(1)
    ).first()
    return (int(row[0]), int(row[1])) if row else None


def add_segment(session: str, node: str, entries: list[tuple[Pos, bytes]]) -> bool:
    """Archive `entries` (in id order) in one segment, committed; False when another archiver wrote it first."""
    seg = ProfilerFrameSegment(
        session=session,
        node=node,
        first_ms=entries[0][0][0],
        first_seq=entries[0][0][1],
        last_ms=entries[-1][0][0],
        last_seq=entries[-1][0][1],
        frames=len(entries),
        data=encode(entries),
    )
    db.session.add(seg)
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        return False
    return True


def _after(after: Pos) -> Any:
    ms, seq = after
    return db.or_(
        ProfilerFrameSegment.last_ms > ms,
        db.and_(ProfilerFrameSegment.last_ms == ms, ProfilerFrameSegment.last_seq > seq),
    )


def read(session: str, node: str, after: Pos, hi_ms: int) -> Iterator[tuple[Pos, bytes]]:
    """Archived entries of `node` after `after` up to millisecond `hi_ms`, in id order, a few segments a query."""
    while True:
        segs = list(
            db.session.execute(
                db.select(ProfilerFrameSegment.data)
                .where(
                    ProfilerFrameSegment.session == session, ProfilerFrameSegment.node == node, _after(after)
                )
                .where(ProfilerFrameSegment.first_ms <= hi_ms)
                .order_by(ProfilerFrameSegment.first_ms, ProfilerFrameSegment.first_seq)
                .limit(BATCH)
            ).scalars()
        )
        for blob in segs:
            for pos, data in decode(blob):
                if pos[0] > hi_ms:
                    return
                if pos > after:
                    after = pos
                    yield pos, data
        if len(segs) < BATCH:
            return


def count(session: str, node: str, after: Pos, hi_ms: int) -> tuple[int, Pos | None]:
    """How many archived entries of `node` lie after `after` up to `hi_ms`, and the last one's id: whole segments
    count by their row, the two at the edges by their lines."""
    n, last = 0, None
    seg = ProfilerFrameSegment
    rows = db.session.execute(
        db.select(seg.first_ms, seg.first_seq, seg.last_ms, seg.last_seq, seg.frames)
        .where(seg.session == session, seg.node == node, _after(after), seg.first_ms <= hi_ms)
        .order_by(seg.first_ms, seg.first_seq)
    ).all()
    for first_ms, first_seq, last_ms, last_seq, frames in rows:
        if (first_ms, first_seq) > after and last_ms <= hi_ms:
            n, last = n + frames, (last_ms, last_seq)
            continue
        blob = db.session.get(seg, (session, node, first_ms, first_seq)).data  # type: ignore[union-attr]
        for pos, _ in decode(blob):
            if after < pos and pos[0] <= hi_ms:
                n, last = n + 1, pos
    return n, last


def archive_node(client: redis.Redis, node: str, start_ms: int, age_ms: float, most: int, force: bool) -> int:
    """Archive `node`'s stream from `start_ms` (or after what is archived) in segments of at most `most` frames:
    the oldest waiting frame must be `age_ms` old (Redis' clock) unless `force`; returns frames archived."""
    stream = names.frames_stream(node)
    done = 0
    after = max(last_archived(LIVE, node) or before_ms(start_ms), before_ms(start_ms))
    now_ms = None
    while True:
        low = exclusive(after)
        if not force and age_ms > 0:
            oldest: Any = client.xrange(stream, min=low, max="+", count=1)
            if not oldest:
                return done
            if now_ms is None:
                sec, micro = client.time()
                now_ms = sec * 1000 + micro // 1000
            if now_ms - parse_id(oldest[0][0])[0] < age_ms:
                return done
        page: Any = client.xrange(stream, min=low, max="+", count=most)
        entries = [(parse_id(eid), fields[b"data"]) for eid, fields in page if b"data" in fields]
        if not entries:
            return done
        if add_segment(LIVE, node, entries):
            done += len(entries)
        after = last_archived(LIVE, node) or entries[-1][0]
        if len(page) < most:
            return done
