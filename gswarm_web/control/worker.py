"""The control worker's machinery: tasks that run inside the Flask app, the bootstep that runs the stream consumers
(node reports, heartbeats, frames) as threads of the worker's main process, and the consumer itself: a Redis stream
read through a consumer group, in batches.

`gswarm_web.celery_app` puts it together: which tasks, which consumers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis
from celery import Task, bootsteps
from flask import Flask

from gswarm_tasks import names
from gswarm_tasks.celery_app import GswarmTask

log = logging.getLogger(__name__)


class Consumer(Protocol):
    consumer: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


class ControlTask(GswarmTask):
    """Runs inside the Flask app context, so tasks use the same tables and session as the API."""

    flask_app: Flask | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        assert ControlTask.flask_app is not None, "the control worker's app is not set"
        with ControlTask.flask_app.app_context():
            return Task.__call__(self, *args, **kwargs)


class ControlConsumers(bootsteps.StartStopStep):
    """On a worker that consumes `control`, run the stream consumers in its main process."""

    requires = {"celery.worker.components:Pool"}
    # Each builds one consumer from the worker's hostname (stable, so a restarted worker finds its own backlog).
    builders: list[Callable[[str], Consumer]] = []

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.consumers: list[Consumer] = []

    def start(self, worker: Any) -> None:
        queues = worker.app.amqp.queues.consume_from or worker.app.amqp.queues
        if names.CONTROL_QUEUE not in queues:
            return
        self.consumers = [build(worker.hostname) for build in self.builders]
        for c in self.consumers:
            c.start()
        log.info("control consumers started: %d", len(self.consumers))

    def stop(self, worker: Any) -> None:
        # All at once: each waits out its blocking read (up to a second), which one after another added up to 3 s.
        stoppers = [threading.Thread(target=c.stop) for c in self.consumers]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        self.consumers = []


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
            self.stream,
            self.group,
            self.consumer,
            min_idle_time=self.claim_idle_ms,
            start_id="0-0",
            count=self.batch,
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
