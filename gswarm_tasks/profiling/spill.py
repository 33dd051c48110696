"""Frames that could not reach Redis, kept on the node's disk so they outlive the worker: a bounded JSON-lines file,
replayed in order when Redis answers again, then removed.

A replayed frame gets the stream id its sample time had on Redis' clock (the node's time plus the skew it last
measured), so it lands inside the session windows it belongs to, and Redis refuses an id it already has: a replay
that was cut short and runs again delivers every frame once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from .. import names

log = logging.getLogger(__name__)

SPILL_FILE = ".frames-spill.jsonl"
DROPPED_FILE = ".frames-dropped"
REPLAY_BATCH = 1000


def stream_id(frame_time: float, skew_s: float) -> str:
    """The stream id of a frame sampled at `frame_time` (node clock) on Redis' clock."""
    return f"{int((frame_time + skew_s) * 1000)}-0"


class FrameSpill:
    """The spill file of one node, with the count of frames it had to drop (kept beside it)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.path = root / SPILL_FILE
        self.dropped_path = root / DROPPED_FILE
        self.max_bytes = max_bytes
        try:
            self.dropped = int(self.dropped_path.read_text())
        except (OSError, ValueError):
            self.dropped = 0

    def pending(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    def last_skew(self) -> float | None:
        """The skew the previous writer measured (its last line), for a worker that has not reached Redis yet."""
        try:
            with open(self.path, "rb") as f:
                f.seek(max(0, self.path.stat().st_size - 65536))
                tail = f.read().splitlines()
            return float(json.loads(tail[-1])["skew"]) if tail else None
        except (OSError, ValueError, KeyError, IndexError):
            return None

    def drop(self, n: int) -> None:
        """Count frames that were lost (a bound was hit); the count survives restarts."""
        if n <= 0:
            return
        self.dropped += n
        tmp = self.dropped_path.with_suffix(".tmp")
        tmp.write_text(str(self.dropped))
        os.replace(tmp, self.dropped_path)
        log.warning("%d profiler frame(s) dropped (%d in all): the spill file is full", n, self.dropped)

    def append(self, frames: list[dict[str, Any]], skew_s: float) -> None:
        """Write frames at the end of the file (synced), as many as fit under the bound; the rest are dropped."""
        size = self.path.stat().st_size if self.path.exists() else 0
        lines = []
        for frame in frames:
            line = json.dumps({"skew": skew_s, "frame": frame}, separators=(",", ":")) + "\n"
            if size + len(line) > self.max_bytes:
                break
            lines.append(line)
            size += len(line)
        if lines:
            with open(self.path, "a", encoding="utf-8") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
        self.drop(len(frames) - len(lines))

    def _batches(self) -> Iterator[list[dict[str, Any]]]:
        batch: list[dict[str, Any]] = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    batch.append(json.loads(line))
                except ValueError:
                    continue  # a line cut short by a crash mid-write
                if len(batch) >= REPLAY_BATCH:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def replay(self, client: redis.Redis, node: str) -> int:
        """Send every spilled frame in order, then remove the file; returns how many Redis took now. A Redis
        error leaves the file (the next replay skips what already arrived)."""
        stream = names.frames_stream(node)
        sent = 0
        for batch in self._batches():
            pipe = client.pipeline(transaction=False)
            for item in batch:
                frame = item["frame"]
                pipe.xadd(
                    stream,
                    {"data": json.dumps(frame)},
                    id=stream_id(float(frame["time"]), float(item.get("skew") or 0.0)),
                    maxlen=names.FRAMES_MAXLEN,
                    approximate=True,
                )
            for result in pipe.execute(raise_on_error=False):
                if isinstance(result, redis.ConnectionError | redis.TimeoutError):
                    raise result
                if not isinstance(result, Exception):  # a refused id arrived in an earlier replay
                    sent += 1
        self.path.unlink(missing_ok=True)
        if sent:
            log.info("replayed %d spilled frame(s) of %s", sent, node)
        return sent
