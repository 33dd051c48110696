"""Running a chain's next steps in the message that ran its step, not through the broker.

A linear stretch of a workflow travels as one Celery chain: each step, done, sends the next, and the node's worker
takes it from Redis again (a send, a delivery, an unacknowledged-index write, a hand-over to a pool process and an
ack: most of a quick step's cost). When the next step of the chain runs on this same node and has no time limit of
its own, the step that just finished runs it at once, in the same pool process, as that step's own request: its
own id, retries, chain and reports, so a retry, a busy device or a lost Redis sends *that* step back to the broker
with the rest of the chain, exactly as its own delivery would have. A message runs further steps this way for at
most RUN_FOR_S (then the rest of its chain goes through the broker, letting other work of the node in between).

A step run this way is written down before it starts (`names.inline_step_key` of the message's id, and the other way
round, in the round trip that reported the previous step), so a pool process that dies under it, or a hard time
limit, reports that step failed and not only the message's own (node/lifecycle.py), and a cancel of that step
revokes the message that runs it (gswarm_web/workflows/cancel.py). A redelivered message starts again at its own step:
every step is idempotent by its id, and those already done report again and run nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .. import names

RUN_FOR_S = 1.0  # how long one message keeps running its chain's next steps itself


def candidate(request: Any) -> dict[str, Any] | None:
    """The next signature of the request's chain when this message may run it itself, else None."""
    chain = getattr(request, "chain", None)
    began = getattr(request, "gswarm_began", None)
    if not chain or began is None or time.monotonic() - began > RUN_FOR_S:
        return None
    if (request.timelimit or (None, None))[1]:
        return None  # the message runs under a step's own limit (a step's own always has a soft one; a node
        # sending on a chain sets the worker's default hard limit, which every message has anyway)
    sig = chain[-1]
    if not isinstance(sig, dict) or sig.get("task") != names.WORKFLOW_STEP:
        return None
    opts = sig.get("options") or {}
    here = (request.delivery_info or {}).get("routing_key")
    args = sig.get("args") or []
    if not here or opts.get("queue", opts.get("routing_key")) != here or not opts.get("task_id"):
        return None
    if opts.get("soft_time_limit") or opts.get("time_limit"):
        return None  # its own limit applies to its own message
    if not (args and isinstance(args[0], dict) and "task_id" in args[0] and "workflow_id" in args[0]):
        return None
    return sig


def mark(pipe: Any, request: Any, sig: dict[str, Any], keep_s: int) -> None:
    """Write down, in the previous step's round trip, which step the message `request` belongs to runs next, and
    which message runs that step (a cancel revokes the message: revoking the step's own id finds no task); kept
    `keep_s`, as long as a message may run (its hard time limit)."""
    outer = getattr(request, "gswarm_outer", None) or request.id
    pipe.set(names.inline_step_key(outer), json.dumps(sig["args"][0]), ex=keep_s)
    pipe.set(names.inline_message_key(str(sig["args"][0]["task_id"])), outer, ex=keep_s)


def context(outer: Any, sig: dict[str, Any], prefetched: list[Any] | None) -> dict[str, Any]:
    """The request of a step run inline: what its own delivery would have carried (same queue and priority as
    the message that runs it), with the rest of the chain and its prologue's replies read already."""
    opts = sig.get("options") or {}
    task_id = str(opts["task_id"])
    return {
        "id": task_id,
        "correlation_id": task_id,
        "args": list(sig.get("args") or []),
        "kwargs": dict(sig.get("kwargs") or {}),
        "chain": outer.chain,
        "retries": 0,
        "is_eager": False,
        "called_directly": False,
        "delivery_info": dict(outer.delivery_info or {}),
        "hostname": outer.hostname,
        "root_id": outer.root_id or outer.id,
        "parent_id": outer.id,
        "reply_to": outer.reply_to,
        "origin": getattr(outer, "origin", None),
        "ignore_result": True,
        "argsrepr": opts.get("argsrepr"),
        "kwargsrepr": opts.get("kwargsrepr"),
        "gswarm_prefetched": prefetched,
        "gswarm_began": outer.gswarm_began,
        "gswarm_outer": getattr(outer, "gswarm_outer", None) or outer.id,
        "gswarm_inline": True,
    }
