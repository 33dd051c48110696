"""The workflow dispatcher: decides which chains may start (their first step's dependencies are done, the
workflow's concurrency limit allows), skips what can no longer run, ends the workflow, and sends chains.

Sending is an outbox: a step is marked `queued` in the transaction that decides to send it, and `dispatched`
once the broker took it, so a crash in between is repaired by `resend_undispatched` (the beat sweep).
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from datetime import timedelta
from typing import Any

from gswarm_tasks import names
from gswarm_tasks.celery_app import priority_value
from gswarm_tasks.errors import DependencyFailed

from ..control.serving import state as service_state
from ..extensions import db, redis_client, sender
from ..tables import TaskRecord, WorkflowRun
from ..tables import utcnow as now

TERMINAL = ("succeeded", "failed", "cancelled", "skipped")
BAD = ("failed", "cancelled", "skipped")
Sends = list[tuple[str, list[Any]]]


def _spec(run_id: str, step: Any) -> dict[str, Any]:
    p = dict(step.params)
    return {
        "task_id": step.id,
        "workflow_id": run_id,
        "step_id": step.step_id,
        "action_type": step.kind,
        "params": p["params"],
        "retries": p.get("retries", 0),
        "retry_backoff": p.get("retry_backoff", 1.0),
        "exclusive": step.exclusive or [],
        "service_id": p.get("service_id"),
        "source": p.get("source"),
        "trust_remote_code": p.get("trust_remote_code", False),
        "chunk_id": p.get("chunk_id"),
        "chunks": p.get("chunks"),
        "allowed_origins": p.get("allowed_origins"),  # the replicas a health check or inference may call
    }


def _signature(app: Any, run_id: str, step: Any) -> Any:
    opts: dict[str, Any] = {
        "queue": step.node,
        "routing_key": step.node,
        "task_id": step.id,
        "priority": priority_value(step.priority),
    }
    timeout = step.params.get("timeout_s")
    if timeout:
        opts.update(soft_time_limit=float(timeout), time_limit=float(timeout) + 10)
    # The message carries ids only; the step's full spec waits in Redis (a chain message carries every later
    # signature of the chain, so small ones keep a long chain from costing O(n^2) in serialization).
    ref = {"task_id": step.id, "workflow_id": run_id, "step_id": step.step_id}
    # A step's outcome travels on the reports stream: the sender does not subscribe to a Celery result. What
    # monitors show of its arguments (argsrepr) is its step's id: it is copied into every earlier message of its
    # chain, where the ids' repr was half the signature's bytes (Celery's own saferepr walks every argument).
    opts.update(ignore_result=True, argsrepr=f"({step.step_id!r},)", kwargsrepr="{}")
    return app.signature(names.WORKFLOW_STEP, args=(ref,), immutable=True, **opts)


def advance(run: WorkflowRun, steps: dict[str, Any]) -> Sends:
    """Skip what can no longer run, pick the chains that may start now, and end the workflow when it is done.

    Returns the chains to send (after the caller commits)."""
    by_step = {s.step_id: s for s in steps.values()}
    changed = True
    while changed:  # skipping propagates down the DAG
        changed = False
        for s in steps.values():
            # A queued step behind a failed one in its chain never runs either: Celery stops the chain.
            bad = next((d for d in s.depends_on or [] if by_step[d].state in BAD), None)
            if s.state in ("pending", "queued") and bad is not None:
                s.state, s.finished_at = "skipped", now()
                why = f"not run: {bad}, which it depends on, {by_step[bad].state}"
                s.error = DependencyFailed(why, {"dependency": bad, "status": by_step[bad].state}).to_dict()
                if s.kind == "serve":
                    service_state.serve_step_ended(s, sent=False)
                changed = True
    sends: Sends = []
    if run.status == "running":
        by_segment: dict[int, list[Any]] = defaultdict(list)
        for s in steps.values():
            by_segment[int(s.segment or 0)].append(s)
        limit = int((run.queue_config or {}).get("max_concurrent_tasks") or 0)
        active = sum(1 for seg in by_segment.values() if any(x.state in ("queued", "running") for x in seg))
        for seg_no in sorted(by_segment):
            seg = sorted(by_segment[seg_no], key=lambda x: x.position or 0)
            head = seg[0]
            if head.state != "pending" or any(by_step[d].state != "succeeded" for d in head.depends_on or []):
                continue
            if limit and active >= limit:
                break
            for s in seg:
                s.state = "queued"
            sends.append((run.id, seg))
            active += 1
    states = {s.state for s in steps.values()}
    if run.status == "running" and states <= set(TERMINAL):
        if states == {"succeeded"}:
            run.status = "succeeded"
        elif "failed" in states or "cancelled" not in states:
            run.status = "failed"
        else:
            run.status = "cancelled"  # a step was cancelled and none failed
        run.finished_at = now()
    return sends


_PUBLISH_BATCH = 500


def _batched(producer: Any) -> Any:
    """The producer's publish batch (kombu >= 5.7 pipelines a batch's messages), else publishing one by one."""
    batch = getattr(producer, "batch", None)
    return batch(max_size=4 * _PUBLISH_BATCH) if batch is not None else contextlib.nullcontext()


def _send_chain(sigs: list[Any], producer: Any) -> None:
    """A Celery chain, sent as Celery's `chain.apply_async` sends it: the first step's message carries the rest of
    the chain (last step first) in the protocol's `chain` field, and each step, done, sends the next. Published here
    with the caller's producer: `chain.apply_async(producer=...)` does not hand its producer on to the first step,
    which would take one of its own from the pool, outside the batch (a Redis round trip per chain), and it copies
    and freezes every signature for results that `ignore_result` steps never have."""
    first, rest = sigs[0], sigs[:0:-1]
    first.apply_async(producer=producer, **({"chain": rest} if rest else {}))


def send(sends: Sends) -> None:
    if not sends:
        return
    app = sender()
    sent: list[str] = []
    pipe = redis_client().pipeline(transaction=False)
    for run_id, seg in sends:
        for s in seg:
            pipe.hset(names.workflow_specs_key(run_id), s.id, json.dumps(_spec(run_id, s)))
        pipe.expire(names.workflow_specs_key(run_id), names.KEEP_S)
    pipe.execute()
    try:
        with app.producer_or_acquire() as producer:
            for part in range(0, len(sends), _PUBLISH_BATCH):
                batch = sends[part : part + _PUBLISH_BATCH]
                # One Redis round trip for the batch's messages; a row is `dispatched` only once it went out.
                with _batched(producer):
                    for run_id, seg in batch:
                        _send_chain([_signature(app, run_id, s) for s in seg], producer)
                sent.extend(s.id for _, seg in batch for s in seg)
    finally:
        if sent:
            # the session's objects are not looked through (the commit expires them all anyway)
            done = db.update(TaskRecord).where(TaskRecord.id.in_(sent)).values(dispatched=True)
            db.session.execute(done.execution_options(synchronize_session=False))
            db.session.commit()


def resend_undispatched(older_than_s: float = 5.0) -> int:
    """Send again what was decided but never reached the broker (a crash between commit and send)."""
    cutoff = now() - timedelta(seconds=older_than_s)
    rows = list(
        db.session.scalars(
            db.select(TaskRecord).where(
                TaskRecord.workflow_id.is_not(None),
                TaskRecord.state == "queued",
                TaskRecord.dispatched.is_(False),
                TaskRecord.created_at < cutoff,
            )
        )
    )
    by_seg: dict[tuple[str, int], list[TaskRecord]] = defaultdict(list)
    for r in rows:
        by_seg[(str(r.workflow_id), int(r.segment or 0))].append(r)
    sends = [(wf, sorted(seg, key=lambda x: x.position or 0)) for (wf, _), seg in by_seg.items()]
    send(sends)
    return len(rows)
