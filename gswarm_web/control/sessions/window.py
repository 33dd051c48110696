"""A session's frames, wherever they are: a node's archive first, then its stream for what is not archived yet
(an imported session has its archive only), inside the session's window, at the session's own rate, the nodes
merged by time; read whole or a page at a time, a page ending with a cursor that says where each node stands, so
the pages of a window put together are exactly the window read whole (every frame, in order, once)."""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from gswarm_tasks import names
from gswarm_tasks.errors import InvalidRequest

from ...profiling.export import keep, slim
from . import archive
from .archive import LIVE, MAXSEQ, Pos, before_ms, parse_id

STREAM_PAGE = 10_000  # stream entries read per round trip
CURSOR_MAX_CHARS = 1 << 20
MAX_MS = 1 << 47  # a stream id's milliseconds (year 6429): bigger ones are not a cursor this export gave
Tagged = tuple[str, Pos, dict[str, Any]]


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


@dataclass
class Source:
    """Where a session's frames are: `key` "" (the nodes' streams and their archive) or an imported session."""

    key: str
    nodes: list[str]
    period_s: float

    @property
    def live(self) -> bool:
        return self.key == LIVE


@dataclass
class Cursor:
    """Where a page ended: per node the stream id and time of its last frame given, and the next `frame_id`."""

    fid: int = 0
    nodes: dict[str, tuple[int, int, float]] = field(default_factory=dict)

    def encode(self) -> str:
        doc = {"f": self.fid, "n": {k: list(v) for k, v in self.nodes.items()}}
        return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str, nodes: list[str]) -> Cursor:
        bad = InvalidRequest(
            "cursor: not a cursor this export gave (take `next_cursor` as it is)", {"field": "cursor"}
        )
        if len(text) > CURSOR_MAX_CHARS:
            raise bad
        try:
            doc = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            fid, raw = doc["f"], doc["n"]
            positions = {str(k): (int(v[0]), int(v[1]), float(v[2])) for k, v in raw.items()}
        except (
            ValueError,
            KeyError,
            TypeError,
            IndexError,
            OverflowError,
            binascii.Error,
            AttributeError,
        ) as exc:
            raise bad from exc
        if not isinstance(fid, int) or fid < 0 or not set(positions) <= set(nodes):
            raise bad
        if any(
            not (0 <= ms < MAX_MS and 0 <= seq <= MAXSEQ and math.isfinite(t))
            for ms, seq, t in positions.values()
        ):
            raise bad
        return cls(fid, positions)


def _stream(client: redis.Redis, node: str, after: Pos, hi_ms: int) -> Iterator[tuple[Pos, bytes]]:
    low = archive.exclusive(after)
    while True:
        page: Any = client.xrange(names.frames_stream(node), min=low, max=str(hi_ms), count=STREAM_PAGE)
        for eid, fields in page:
            if b"data" in fields:
                yield parse_id(eid), fields[b"data"]
        if len(page) < STREAM_PAGE:
            return
        low = "(" + (page[-1][0].decode() if isinstance(page[-1][0], bytes) else page[-1][0])


def entries(client: redis.Redis | None, source: Source, node: str, after: Pos, hi_ms: int) -> Iterator[Any]:
    """(id, frame JSON) of `node` after `after` up to `hi_ms`: the archive, then the stream past the archive."""
    for pos, data in archive.read(source.key, node, after, hi_ms):
        after = pos
        yield pos, data
    if source.live and client is not None:
        yield from _stream(client, node, after, hi_ms)


def node_frames(
    client: redis.Redis | None, source: Source, node: str, window: tuple[datetime, datetime], at: Any = None
) -> Iterator[Tagged]:
    """`node`'s frames in the window at the session's rate, slimmed, from the cursor position `at` (id, time)."""
    lo, hi = window
    t_lo, t_hi = lo.timestamp(), hi.timestamp()
    after, last_kept = ((at[0], at[1]), at[2]) if at else (before_ms(_ms(lo)), None)
    for pos, data in entries(client, source, node, after, _ms(hi)):
        f = json.loads(data)
        t = f.get("time")
        # Stream ids bound the read; a frame whose own time lies outside the window (kept through an outage) is not
        # the window's.
        if not isinstance(t, int | float) or not t_lo <= t <= t_hi or not keep(t, last_kept, source.period_s):
            continue
        last_kept = t
        yield node, pos, slim(f)


def merged(
    client: redis.Redis | None,
    source: Source,
    window: tuple[datetime, datetime],
    cursor: Cursor | None = None,
) -> Iterator[Tagged]:
    """Every node's frames, merged by (time, node): the same order whole or page after page."""
    at = cursor.nodes if cursor else {}
    streams = [node_frames(client, source, n, window, at.get(n)) for n in sorted(source.nodes)]
    return heapq.merge(*streams, key=lambda x: (x[2]["time"], x[0]))


def frames(client: redis.Redis | None, source: Source, window: tuple[datetime, datetime]) -> Iterator[dict]:
    for _node, _pos, f in merged(client, source, window):
        yield f


def page(
    client: redis.Redis | None, source: Source, window: tuple[datetime, datetime], cursor: Cursor, budget: int
) -> tuple[list[dict], Cursor | None]:
    """At most `budget` readings (a GPU's or a host's) from the cursor on, whole frames, and the cursor after them
    (None at the end)."""
    out: list[dict] = []
    readings = 0
    it = merged(client, source, window, cursor)
    nxt = Cursor(cursor.fid, dict(cursor.nodes))
    for node, pos, f in it:
        size = 1 + len(f.get("gpus") or [])
        if out and readings + size > budget:
            return out, nxt
        out.append(f)
        readings += size
        nxt.nodes[node] = (pos[0], pos[1], f["time"])
        nxt.fid += 1
    return out, None


def counts(client: redis.Redis | None, source: Source, window: tuple[datetime, datetime]) -> dict[str, int]:
    """Frames recorded in the window (every frame, before the session's rate): archived, and waiting in streams."""
    lo, hi = window
    archived = pending = 0
    for node in source.nodes:
        n, last = archive.count(source.key, node, before_ms(_ms(lo)), _ms(hi))
        archived += n
        if source.live and client is not None:
            after = max(last or before_ms(_ms(lo)), archive.last_archived(LIVE, node) or before_ms(_ms(lo)))
            pending += sum(1 for _ in _ids(client, node, after, _ms(hi)))
    return {"frames": archived + pending, "archived_frames": archived, "pending_frames": pending}


def _ids(client: redis.Redis, node: str, after: Pos, hi_ms: int) -> Iterator[Pos]:
    for pos, _data in _stream(client, node, after, hi_ms):
        yield pos
