"""The frames consumer: reads every node's frame stream through one consumer group and keeps each node's newest
frame (for `/metrics`, the dashboard and liveness); beside it, in the control worker, the archiver keeps the frames
of every session durably (`archiver.py`), and sessions read their windows from the archive and the streams."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis
from flask import Flask

from gswarm_tasks import names

from .archiver import Archiver

log = logging.getLogger(__name__)


class FramesConsumer:
    """Reads every node's frame stream through one consumer group; keeps each node's newest frame.

    Streams are found by name (`gswarm:frames:*`) every few seconds, so a new node needs no restart.
    """

    def __init__(
        self,
        client: redis.Redis,
        consumer: str,
        batch: int = 5000,
        block_ms: int = 500,
        archiver: Archiver | None = None,
    ) -> None:
        self.client = client
        self.archiver = archiver
        self.consumer = consumer
        self.batch = batch
        self.block_ms = block_ms
        self.streams: dict[Any, Any] = {}
        self._next_scan = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.frames = 0

    def discover(self) -> None:
        for key in self.client.scan_iter(match=names.frames_stream("*"), count=1000):
            name = key.decode() if isinstance(key, bytes) else key
            if name not in self.streams:
                try:
                    self.client.xgroup_create(name, names.CONTROL_GROUP, id="$", mkstream=True)
                except redis.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
                self.streams[name] = ">"
        self._next_scan = time.monotonic() + 5.0

    def poll_once(self, block_ms: int | None = None) -> int:
        if time.monotonic() >= self._next_scan:
            self.discover()
        if not self.streams:
            self._stop.wait(0.5)
            return 0
        res: Any = self.client.xreadgroup(
            names.CONTROL_GROUP,
            self.consumer,
            self.streams,
            count=self.batch,
            block=self.block_ms if block_ms is None else block_ms,
        )
        if not res:
            return 0
        pipe = self.client.pipeline(transaction=False)
        n = 0
        for stream, entries in res:
            if not entries:
                continue
            newest = entries[-1][1].get(b"data")
            node = names.node_of_frames_stream(stream.decode() if isinstance(stream, bytes) else stream)
            if newest is not None:
                pipe.hset(names.METRICS_LATEST_KEY, node, newest)
            pipe.xack(stream, names.CONTROL_GROUP, *[eid for eid, _ in entries])
            n += len(entries)
        pipe.hset(names.METRICS_SEEN_KEY, names.CONTROL_GROUP, time.time())
        pipe.execute()
        self.frames += n
        return n

    def run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.poll_once()
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("frames consumer failing, will retry: %s", exc)
                failing = True
                self.streams.clear()
                self._stop.wait(1.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gswarm-frames", daemon=True)
        self._thread.start()
        if self.archiver is not None:
            self.archiver.start()

    def stop(self) -> None:
        self._stop.set()
        if self.archiver is not None:
            self.archiver.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=3)
        if self.archiver is not None:
            self.archiver.stop()


def frames_consumer(redis_url: str, consumer: str | None = None, app: Flask | None = None) -> FramesConsumer:
    """The consumer, and with the control worker's Flask app the archiver of sessions' frames."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    archiver = None
    if app is not None:
        archiver = Archiver(app, redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5))
    return FramesConsumer(client, consumer or f"frames-{os.getpid()}", archiver=archiver)
