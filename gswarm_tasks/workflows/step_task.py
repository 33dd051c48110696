"""The workflow step task: one action of a workflow, run where its device is.

Steps of a linear stretch of the DAG travel as one Celery chain; a step reports started / retrying /
succeeded / failed / cancelled to the intake stream, which the control worker reads to record states and
start whatever became ready. Outputs go to Redis first, so a later step of the same chain can resolve
`${step.field}` before the control worker has even seen the event. A step is idempotent by its task id. The next
steps of a chain that run on the same node are run by the message that ran the step before them, without a
broker round trip each (workflows/inline.py).
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import random
import threading
import time
from contextlib import ExitStack
from typing import Any

import redis
from celery import Task
from celery.app.task import Context
from celery.exceptions import Ignore, Retry, SoftTimeLimitExceeded

from .. import names
from ..celery_app import NodeTask, app
from ..context import require_node
from ..errors import Cancelled, GswarmError, InvalidRequest, LeaseBusy, TaskFailed, error_dict
from ..locks import device_leases, model_leases
from ..models.tasks import lease_tiers
from ..reporting import redis_of, report
from . import inline
from .actions import recorded_outputs, resolve, run_action

log = logging.getLogger(__name__)

STARTED_AFTER_S = 0.02
MODEL_ACTIONS = ("download", "copy", "move", "delete")
REDIS_BACK_WITHIN_S = (
    120.0  # how long a step whose Redis went away waits for it before leaving it to the broker
)
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)


class _Announcer:
    """One thread per process that runs a callback after a delay unless it was called off first
    (a Timer thread per step costs more than the quickest steps themselves)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, threading.Event, Any]] = []
        self.n = 0
        threading.Thread(target=self._run, daemon=True, name="gswarm-announcer").start()

    def later(self, delay: float, fn: Any) -> threading.Event:
        off = threading.Event()
        with self.cond:
            self.n += 1
            heapq.heappush(self.heap, (time.monotonic() + delay, self.n, off, fn))
            self.cond.notify()
        return off

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    self.cond.wait(None if not self.heap else max(0.0, self.heap[0][0] - time.monotonic()))
                _, _, off, fn = heapq.heappop(self.heap)
            if not off.is_set():
                try:
                    fn()
                except Exception as exc:
                    log.debug("announcement failed: %s", exc)


_announcer_instance: _Announcer | None = None


def _announcer() -> _Announcer:
    global _announcer_instance
    if (
        _announcer_instance is None or _announcer_instance.pid != os.getpid()
    ):  # a forked pool child needs its own
        _announcer_instance = _Announcer()
    return _announcer_instance


def emit(client: Any, spec: dict[str, Any], event: str, at: float | None = None, **data: Any) -> None:
    """Report a step event (`client` may be a pipeline)."""
    report(client, names.REPORT_STEP, spec["task_id"], event, data, at, workflow_id=spec["workflow_id"])


def _stop_chain(task: Task) -> None:
    task.request.chain = None


def _prologue_reads(pipe: Any, spec: dict[str, Any]) -> None:
    tid = spec["task_id"]
    pipe.exists(names.cancel_workflow_key(spec["workflow_id"]), names.cancel_task_key(tid))
    pipe.get(names.step_done_key(tid))
    pipe.hget(names.workflow_specs_key(spec["workflow_id"]), tid)


def _prologue(task: Task, client: redis.Redis, spec: dict[str, Any]) -> tuple[dict[str, Any], bool, Any]:
    """(full spec, cancelled, previous result): what a step checks before it starts, read in the round trip that
    counted its delivery (`StepTask.prefetch`), or in one of its own."""
    tid = spec["task_id"]
    replies = getattr(task.request, "gswarm_prefetched", None)
    if not replies or len(replies) != 3:
        pipe = client.pipeline(transaction=False)
        _prologue_reads(pipe, spec)
        replies = pipe.execute()
    cancelled, done, full = replies
    if full is not None:
        spec = json.loads(full)
    elif "action_type" not in spec:
        raise TaskFailed(f"step {tid} has no spec in Redis (was it flushed?)", {"task_id": tid})
    return spec, bool(cancelled), done


def _run_leased(
    task: Task, client: redis.Redis, spec: dict[str, Any], attempt: int, held: ExitStack
) -> tuple[Any, float, float]:
    """Resolve references, hold the step's devices and run it; (result, started_at, finished_at). The model copies
    it writes stay held in `held` until the caller has reported the outcome."""
    params = spec["params"]
    outputs: dict[str, dict[str, Any]] | None = None
    if "${" in json.dumps(params):
        outputs = recorded_outputs(client, spec["workflow_id"])
        params = resolve(params, outputs)
    node = require_node().name if spec["action_type"] in MODEL_ACTIONS else ""
    tiers = lease_tiers(node, spec["action_type"], params) if node else []
    if tiers:
        held.enter_context(
            model_leases(client, node, tiers, str(params["model_name"]), spec["task_id"], wait=False)
        )
    # A step that waits for its device is not running yet: it reports `started` once it holds it.
    with device_leases(client, spec.get("exclusive") or [], owner=spec["task_id"], wait=False):
        started_at = time.time()
        # `started` goes out once the step has run a moment; a step quicker than that reports its start
        # inside its `succeeded` event, which halves the events of short steps.
        announce = _announcer().later(
            STARTED_AFTER_S,
            lambda: emit(
                client, spec, "started", at=started_at, attempt=attempt, worker=task.request.hostname
            ),
        )
        try:
            result = run_action(task, spec, params, client, outputs)
        finally:
            announce.set()  # done already: nothing to announce
        finished_at = time.time()  # still holding the devices: the next holder starts after this
    return result, started_at, finished_at


def _on_error(
    task: Task, client: redis.Redis, spec: dict[str, Any], attempt: int, exc: BaseException
) -> None:
    """Retry a step that may succeed later (with backoff and jitter), else report it failed and stop its chain."""
    permanent = isinstance(exc, InvalidRequest) or (isinstance(exc, GswarmError) and exc.status == 404)
    retries = int(spec.get("retries", 0))
    if not permanent and not isinstance(exc, SoftTimeLimitExceeded) and attempt <= retries:
        base = float(spec.get("retry_backoff", 1.0))
        countdown = min(300.0, base * 2 ** (attempt - 1)) * (0.5 + random.random())
        emit(
            client, spec, "retrying", attempt=attempt, error=error_dict(exc), countdown_s=round(countdown, 3)
        )
        raise task.retry(exc=exc, countdown=countdown, max_retries=None) from exc
    emit(client, spec, "failed", attempt=attempt, error=error_dict(exc), started_at=time.time())
    _stop_chain(task)


class StepTask(NodeTask):
    """A workflow step. Its outcome travels on the reports stream and its outputs in Redis, so Celery stores no
    result (nor a STARTED state) for it; what it checks before it starts is read with its delivery count."""

    ignore_result = True

    def prefetch(self, pipe: Any, args: Any, kwargs: Any) -> None:
        spec = (args or [None])[0] if not kwargs else kwargs.get("spec")
        if isinstance(spec, dict) and "task_id" in spec and "workflow_id" in spec:
            _prologue_reads(pipe, spec)


@app.task(name=names.WORKFLOW_STEP, base=StepTask, bind=True)
def step(self: Task, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run one workflow action, then the next steps of its chain that are this node's (workflows/inline.py); stop
    the rest of its chain when one fails or is cancelled.

    The message names the step; its spec (action, parameters, retries, devices) is read from Redis."""
    client = redis_of(self)
    outer = self.request
    outer.gswarm_began = time.monotonic()
    result = _one(self, client, spec)
    current = outer
    while (nxt := getattr(current, "gswarm_next", None)) is not None:
        sig, prefetched = nxt
        outer.chain.pop()
        self.request_stack.push(
            Context(**inline.context(outer, sig, prefetched))
        )  # not push_request: it copies
        current = self.request
        try:
            result = _one(self, client, sig["args"][0])
        except (Retry, Ignore):
            current.chain = None  # the step went back to the broker, with the rest of its chain
        except Exception as exc:  # reported failed: its chain stops
            log.info("step %s failed: %s", current.id, exc)
            current.chain = None
        finally:
            self.pop_request()
        outer.chain = current.chain  # what Celery sends on when this message is done (None: nothing)
    return result


def _one(task: Task, client: redis.Redis, spec: dict[str, Any]) -> dict[str, Any] | None:
    """One step, as the task's current request."""
    try:
        return _step(task, client, spec)
    except REDIS_DOWN as exc:
        # Redis went away under the step (a restart, a failover): not the step's failure, and not one of its
        # retries. Once Redis answers again the step starts over, same id, same chain, same retry count (an action
        # is idempotent by its task id); if it stays away, the unacknowledged message is the broker's to deliver.
        if not _redis_back(client, REDIS_BACK_WITHIN_S):
            raise
        log.warning("step %s: Redis went away (%s); running it again", spec.get("task_id"), exc)
        _again(task, client, countdown=0.0)
        raise Ignore() from None


def _redis_back(client: redis.Redis, within_s: float) -> bool:
    """Whether Redis answers again within `within_s` (tried with a growing pause)."""
    deadline, pause = time.monotonic() + within_s, 0.05
    while True:
        try:
            return bool(client.ping())
        except REDIS_DOWN:
            if time.monotonic() + pause > deadline:
                return False
            time.sleep(pause)
            pause = min(2.0, pause * 2)


def _again(task: Task, client: redis.Redis, countdown: float) -> None:
    """Send this step again (same id, chain and retry count) without counting this delivery, and stop here."""
    if not getattr(task.request, "gswarm_inline", False):  # a step run inline was not counted as a delivery
        pipe = client.pipeline(transaction=False)
        pipe.decr(names.deliveries_key(str(task.request.id), int(task.request.retries or 0)))
        pipe.decr(names.starts_key(str(task.request.id)))
        pipe.execute()
    task.signature_from_request(countdown=countdown).apply_async()
    _stop_chain(task)


def _step(self: Task, client: redis.Redis, spec: dict[str, Any]) -> dict[str, Any] | None:
    # Its starts through the broker so far (retries, and redeliveries after a crash), counted with its delivery; at
    # least its retries + 1 (a first run inline, in the message before it, was counted by no delivery).
    attempt = max(int(getattr(self.request, "gswarm_starts", 0) or 0), int(self.request.retries or 0) + 1)
    spec, cancelled, done = _prologue(self, client, spec)
    if cancelled:
        emit(client, spec, "cancelled", reason="cancelled before it started")
        _stop_chain(self)
        return None
    if done is not None:  # a redelivery of a finished step: report again, do nothing again
        previous = json.loads(done)
        pipe = client.pipeline(transaction=False)
        emit(pipe, spec, "succeeded", outputs=previous, redelivered=True)
        _execute(self, pipe)
        return dict(previous)
    with ExitStack() as held:
        return _run_and_report(self, client, spec, attempt, held)


def _run_and_report(
    self: Task, client: redis.Redis, spec: dict[str, Any], attempt: int, held: ExitStack
) -> dict[str, Any] | None:
    """Run the step and report its outcome (what `held` holds is released after the report)."""
    try:
        result, started_at, finished_at = _run_leased(self, client, spec, attempt, held)
    except Cancelled as exc:
        emit(client, spec, "cancelled", reason=str(exc))
        _stop_chain(self)
        return None
    except LeaseBusy:
        # The device is busy: give the worker slot back and come back shortly, same id, same chain, same
        # retry count (waiting is not a failure, nor a redelivery), far under the visibility timeout.
        _again(self, client, countdown=0.05 + random.random() * 0.2)
        raise Ignore() from None
    except (Retry, Ignore, *REDIS_DOWN):
        raise
    except BaseException as exc:
        _on_error(self, client, spec, attempt, exc)
        raise
    # Outputs and the done mark are written before the event, in one round trip, so the next step of the
    # chain can resolve its references and a redelivery finds the step done.
    outputs_key = names.workflow_outputs_key(spec["workflow_id"])
    pipe = client.pipeline()
    pipe.hset(outputs_key, spec["step_id"], json.dumps(_public(result)))
    pipe.expire(outputs_key, names.KEEP_S)
    pipe.set(names.step_done_key(spec["task_id"]), json.dumps(result), ex=names.KEEP_S)
    emit(pipe, spec, "succeeded", at=finished_at, outputs=result, attempt=attempt, started_at=started_at)
    _execute(self, pipe)
    return _public(result)


def _execute(task: Task, pipe: Any) -> None:
    """Send a done step's writes; when this message runs the chain's next step itself, the round trip also marks
    it and reads what that step checks before it starts."""
    sig = inline.candidate(task.request)
    if sig is not None:
        inline.mark(pipe, task.request, sig, int(task.app.conf.task_time_limit or names.KEEP_S) + 60)
        _prologue_reads(pipe, sig["args"][0])
    replies = pipe.execute()
    if sig is not None:
        task.request.gswarm_next = (sig, replies[-3:])


def _public(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "manifest"}
