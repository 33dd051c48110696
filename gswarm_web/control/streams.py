"""Reading a Redis stream through a consumer group, in batches, on a thread of the control worker."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from gswarm_tasks import names

log = logging.getLogger(__name__)

Handler = Callable[[list[tuple[Any, dict[Any, Any]]]], Any]


class StreamConsumer:
    """Reads one stream through a consumer group in batches, hands each batch to `handler`, then acks it.

    Entries a dead consumer left pending are claimed after `claim_idle_ms`, so a control worker killed
    mid-batch loses nothing. A failing handler is retried after a pause; the entries stay pending.
    """

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        group: str,
        handler: Handler,
        consumer: str | None = None,
        batch: int = 1000,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        min_interval_s: float = 0.0,
    ) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.handler = handler
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        # Waiting a little between batches turns many tiny transactions into few larger ones.
        self.min_interval_s = min_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.processed = 0
        self._own_backlog = True  # first re-read what this consumer took before a restart and never acked

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _claim_stale(self) -> list[tuple[Any, dict[Any, Any]]]:
        res: Any = self.client.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=self.claim_idle_ms, start_id="0-0", count=self.batch
        )
        return [(eid, fields) for eid, fields in res[1] if fields is not None]

    def poll_once(self, block_ms: int | None = None) -> int:
        """Claim stale entries or read new ones, handle them, ack them; returns how many were handled."""
        entries: list[tuple[Any, dict[Any, Any]]] = []
        if self._own_backlog:
            res: Any = self.client.xreadgroup(self.group, self.consumer, {self.stream: "0"}, count=self.batch)
            entries = [(eid, f) for eid, f in (res[0][1] if res else []) if f]
            self._own_backlog = bool(entries)
        if not entries:
            entries = self._claim_stale()
        if not entries:
            res = self.client.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: ">"},
                count=self.batch,
                block=self.block_ms if block_ms is None else block_ms,
            )
            entries = res[0][1] if res else []
        if not entries:
            return 0
        self.handler(entries)
        self.client.xack(self.stream, self.group, *[eid for eid, _ in entries])
        self.processed += len(entries)
        return len(entries)

    def run(self) -> None:
        failing = False
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.client.hset(names.CONTROL_ALIVE_KEY, self.consumer, time.time())
                if failing:
                    self.ensure_group()
                if self.poll_once() and self.min_interval_s:
                    self._stop.wait(max(0.0, self.min_interval_s - (time.monotonic() - began)))
                failing = False
            except Exception as exc:  # keep consuming through Redis or database outages
                self._own_backlog = True  # the failed batch is still pending for us: read it again
                if not failing:
                    log.warning("consumer of %s failing, will retry: %s", self.stream, exc)
                failing = True
                self._stop.wait(1.0)

    def start(self) -> None:
        self.ensure_group()
        self._thread = threading.Thread(target=self.run, name=f"gswarm-consumer-{self.stream}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.block_ms / 1000 + 5)
        try:
            self.client.hdel(names.CONTROL_ALIVE_KEY, self.consumer)
        except redis.RedisError:
            pass
