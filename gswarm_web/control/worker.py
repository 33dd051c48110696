"""The control worker's machinery: tasks that run inside the Flask app, and the bootstep that runs the stream
consumers (node reports, heartbeats, frames) as threads of the worker's main process.

`gswarm_web.celery_app` puts it together: which tasks, which consumers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

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
