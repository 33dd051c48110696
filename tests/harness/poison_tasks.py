"""Tasks that only tests load into a worker (`-I tests.harness.poison_tasks`)."""

from __future__ import annotations

import os
import signal

import redis

from gswarm_tasks.celery_app import NodeTask, app, settings_of


@app.task(name="gswarm.test.poison", base=NodeTask)
def poison(counter_key: str) -> None:
    """Count the attempt, then kill the pool process running it: a worker is lost every time."""
    redis.Redis.from_url(settings_of(app).effective_redis_url).incr(counter_key)
    os.kill(os.getpid(), signal.SIGKILL)
