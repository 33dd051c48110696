"""How a node reports to the control plane: one JSON event per report on the intake stream, live progress in
Redis, and the run of one operation (retries with backoff, cleanup, idempotence by operation id)."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Task

from . import names
from .celery_app import settings_of
from .errors import NetworkError, error_dict

log = logging.getLogger(__name__)


def report(
    client: Any,
    kind: str,
    subject: str,
    event: str,
    data: dict[str, Any] | None = None,
    at: float | None = None,
    workflow_id: str | None = None,
) -> None:
    """Append one report to the intake stream (`client` may be a pipeline); `subject` is the task, step or node
    it is about (a step also names its workflow). Reports of one subject are applied in the order appended."""
    doc = {"kind": kind, "id": subject, "event": event, "data": data or {}, "time": at or time.time()}
    if workflow_id is not None:
        doc["workflow_id"] = workflow_id
    client.xadd(
        names.REPORTS_STREAM, {"event": json.dumps(doc)}, maxlen=names.REPORTS_MAXLEN, approximate=True
    )


def redis_of(task: Task) -> redis.Redis:
    """The Redis client of a task's app (its result backend's connection pool)."""
    client = getattr(task.app.backend, "client", None)
    if client is None:
        client = redis.Redis.from_url(settings_of(task.app).effective_redis_url)
    return client


class Reporter:
    """Progress (bytes done / total, phase) for `GET /queue/tasks/{id}`, and the operation's events."""

    def __init__(
        self,
        task: Task,
        op_id: str,
        interval_s: float = 0.5,
        sink: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.task = task
        self.sink = sink
        self.op_id = op_id
        self.client = redis_of(task)
        self.done = 0
        self.total: int | None = None
        self.phase = "queued"
        self.interval_s = interval_s
        self._last = 0.0

    def event(self, event: str, **data: Any) -> None:
        if self.sink is not None:
            self.sink(event, data)
            return
        report(self.client, names.REPORT_OPERATION, self.op_id, event, data)

    def set_phase(self, phase: str, total: int | None = None, reset: bool = False) -> None:
        self.phase = phase
        if total is not None:
            self.total = total
        if reset:
            self.done = 0
        self.flush()
        self.event("phase", phase=phase)

    def progress(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        mapping: dict[str, str | int | float] = {
            "phase": self.phase,
            "done": self.done,
            "updated_at": time.time(),
        }
        if self.total is not None:
            mapping["total"] = self.total
        try:
            key = names.progress_key(self.op_id)
            pipe = self.client.pipeline()
            pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
            pipe.expire(key, names.KEEP_S)
            pipe.execute()
        except redis.RedisError as exc:  # progress is best effort; the result is not
            log.debug("progress of %s not written: %s", self.op_id, exc)


def read_progress(client: redis.Redis, op_id: str) -> dict[str, Any]:
    raw: dict[bytes, bytes] = client.hgetall(names.progress_key(op_id))  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = k.decode()
        out[key] = v.decode() if key == "phase" else float(v)
    return out


def run_op(
    task: Task,
    op_id: str,
    body: Callable[[Reporter], dict[str, Any]],
    cleanup: Callable[[], None] | None = None,
    retryable: tuple[type[BaseException], ...] = (NetworkError,),
) -> dict[str, Any]:
    """Run one operation: report it started, retry network failures with backoff and jitter, clean up and
    report on final failure, report success. Idempotent by op id: a redelivered finished op is not redone."""
    rep = Reporter(task, op_id)
    done_key = names.op_done_key(op_id)
    finished = rep.client.get(done_key)
    if finished is not None:
        result = dict(json.loads(finished))
        rep.event("succeeded", **result)
        return result
    rep.event("started", attempt=int(task.request.retries or 0) + 1, worker=task.request.hostname)
    t0 = time.perf_counter()
    try:
        result = body(rep)
        result["elapsed_s"] = round(time.perf_counter() - t0, 4)
    except retryable as exc:
        retries = int(task.request.retries or 0)
        if retries < (task.max_retries or 0):
            countdown = min(60.0, 2.0**retries) * (0.5 + random.random())
            rep.event("retrying", error=error_dict(exc), countdown_s=round(countdown, 2))
            raise task.retry(exc=exc, countdown=countdown) from exc
        if cleanup:
            cleanup()
        rep.event("failed", error=error_dict(exc))
        raise
    except BaseException as exc:
        if cleanup:
            cleanup()
        rep.event("failed", error=error_dict(exc))
        raise
    rep.client.set(done_key, json.dumps(result), ex=names.KEEP_S)
    rep.flush()
    rep.event("succeeded", **result)
    return result
