"""The workflow step task: one action of a workflow, run where its device is.

Steps of a linear stretch of the DAG travel as one Celery chain; a step reports started / succeeded /
failed / cancelled into the `gswarm:steps` stream, which the control worker consumes to record state and
start whatever became ready. Outputs go to Redis first, so a later step of the same chain can resolve
`${step.field}` before the control worker has even seen the event. A step is idempotent by its task id.
"""

from __future__ import annotations

import base64
import heapq
import json
import logging
import os
import random
import re
import threading
import time
from typing import Any

import redis
import requests
from celery import Task
from celery.exceptions import Ignore, Retry, SoftTimeLimitExceeded

from .celery_app import NodeTask, app, settings_of
from .devices import Device
from .errors import GswarmError, InvalidRequest, NetworkError, NotFound, TaskFailed
from .locks import Cancelled, LeaseBusy, device_leases
from .model_tasks import op_copy, op_delete, op_download, op_move, op_serve, op_stop
from .ops import Reporter, error_dict, redis_of
from .worker import require_node

log = logging.getLogger(__name__)

STEP_STREAM = "gswarm:steps"
OUTPUTS_KEY = "gswarm:wf:{}:outputs"
STEP_DONE_KEY = "gswarm:step-done:{}"
CANCEL_WF_KEY = "gswarm:cancel:wf:{}"
CANCEL_TASK_KEY = "gswarm:cancel:task:{}"
SPECS_KEY = "gswarm:wf:{}:specs"
STARTED_AFTER_S = 0.02
KEEP_S = 7 * 24 * 3600
REF_RE = re.compile(r"\$\{([^}]*)\}")
DATA_ACTIONS = ("data_create", "data_move", "data_transfer", "inference", "data_merge")


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
    if _announcer_instance is None or _announcer_instance.pid != os.getpid():  # a forked pool child needs its own
        _announcer_instance = _Announcer()
    return _announcer_instance


def emit(client: Any, spec: dict[str, Any], event: str, at: float | None = None, **data: Any) -> None:
    """Append a step event to the stream (`client` may be a pipeline)."""
    client.xadd(
        STEP_STREAM,
        {
            "task_id": spec["task_id"],
            "workflow_id": spec["workflow_id"],
            "event": event,
            "data": json.dumps(data),
            "time": repr(at or time.time()),
        },
        maxlen=1_000_000,
        approximate=True,
    )


def is_cancelled(client: redis.Redis, spec: dict[str, Any]) -> bool:
    return bool(client.exists(CANCEL_WF_KEY.format(spec["workflow_id"]), CANCEL_TASK_KEY.format(spec["task_id"])))


def resolve(value: Any, outputs: dict[str, dict[str, Any]]) -> Any:
    """Replace `${step.field}` (and `${step.output.field}`) with recorded outputs; a whole-string reference
    keeps the output's type."""
    if isinstance(value, dict):
        return {k: resolve(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, outputs) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def lookup(expr: str) -> Any:
        parts = expr.strip().split(".")
        step, fld = (parts[0], parts[-1]) if len(parts) in (2, 3) else (expr, "")
        out = outputs.get(step)
        if out is None or fld not in out:
            raise InvalidRequest(f"${{{expr}}} has no value: {step} recorded {sorted(out or {})}", {"reference": expr})
        return out[fld]

    whole = REF_RE.fullmatch(value)
    if whole:
        return lookup(whole.group(1))
    return REF_RE.sub(lambda m: str(lookup(m.group(1))), value)


def _tier(device: str) -> str:
    return Device.parse(device).tier


def _noop(self: Task, spec: dict[str, Any], p: dict[str, Any], client: redis.Redis) -> dict[str, Any]:
    failures = int(p.get("fail_times", 0))
    if int(self.request.retries or 0) < failures:
        raise TaskFailed(f"noop asked to fail {failures} time(s)", {"attempt": int(self.request.retries or 0) + 1})
    deadline = time.monotonic() + float(p.get("duration_s", 0))
    while time.monotonic() < deadline:
        if is_cancelled(client, spec):
            raise Cancelled("cancelled while running")
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return dict(p.get("outputs") or {})


def _health_check(p: dict[str, Any]) -> dict[str, Any]:
    url = str(p["target_url"])
    try:
        r = requests.get(url, timeout=float(p.get("timeout", 10)))
    except requests.RequestException as exc:
        raise NetworkError(f"health check of {url} failed: {type(exc).__name__}", {"url": url}) from exc
    want = int(p.get("expected_status", 200))
    if r.status_code != want:
        raise TaskFailed(f"health check of {url} answered {r.status_code}, expected {want}", {"url": url})
    return {"status_code": r.status_code, "url": url, "output": url}


def _chunk_locations(chunk_id: str, spec: dict[str, Any], outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a chunk is, as far as this workflow knows: copies its steps made (less those a move removed),
    and the copies the control plane listed at submission for chunks named literally."""
    mine = [o for o in outputs.values() if o.get("chunk_id") == chunk_id]
    removed = {o.get("source_device") for o in mine if o.get("source_removed")}
    locs = [o for o in mine if o.get("device") and (o.get("blake3") or o.get("checksum"))]
    locs += list((spec.get("chunks") or {}).get(chunk_id) or [])
    return [loc for loc in locs if loc["device"] not in removed]


def _best(chunk_id: str, spec: dict[str, Any], outputs: dict[str, Any], node: str, same_node: bool = False) -> Any:
    locs = _chunk_locations(chunk_id, spec, outputs)
    locs.sort(key=lambda loc: (not loc["device"].startswith(f"{node}:"), not loc["device"].endswith(":dram")))
    if same_node:
        locs = [loc for loc in locs if loc["device"].startswith(f"{node}:")]
    if not locs:
        where = f" on {node}" if same_node else ""
        raise NotFound(f"chunk {chunk_id} has no copy{where} this step knows of", {"chunk_id": chunk_id})
    return locs[0]


MAX_READ = 1 << 30  # chunks an inference or a merge reads whole


def run_data_action(
    self: Task, spec: dict[str, Any], p: dict[str, Any], client: redis.Redis, outputs: dict[str, Any]
) -> dict[str, Any]:
    """data_create, data_move, data_transfer, inference, data_merge: each ends with one verified chunk copy."""
    from .data_tasks import copy_chunk, merge_chunks, read_chunk, run_inference, store_chunk

    node = require_node()
    settings = settings_of(self.app)
    atype = spec["action_type"]
    extra: dict[str, Any] = {}
    if atype == "data_create":
        data = base64.b64decode(str(p["data"]), validate=True) if p.get("data") is not None else None
        out = store_chunk(node, settings, spec["chunk_id"], _tier(p["target_device"]), data, p.get("source"))
        out["format"] = p.get("format")
    elif atype in ("data_move", "data_transfer"):
        cid = str(p["data_id"])
        loc = _best(cid, spec, outputs, node.name, same_node=atype == "data_move")
        src = Device.parse(loc["device"])
        source = {"node": src.node, "tier": src.tier, "address": loc.get("address"), "port": loc.get("file_port")}
        delete_source = bool(p.get("delete_source"))
        remove = atype == "data_move" or (delete_source and src.node == node.name)
        out = copy_chunk(node, settings, client, spec["task_id"], cid, _tier(p["target_device"]), source, loc, remove)
        out["format"] = loc.get("format")
        extra["delete_source"] = delete_source
    elif atype == "inference":
        cid = str(p.get("input_data") or p.get("input_data_id") or p.get("input"))
        loc = _best(cid, spec, outputs, node.name)
        data = read_chunk(node, settings, client, cid, loc, MAX_READ)
        url = str(p.get("service_url") or p.get("service"))
        answer = run_inference(url, str(p.get("endpoint") or "/v1/embeddings"), p.get("model_name"), data, cid)
        out = store_chunk(node, settings, spec["chunk_id"], _tier(p["output_device"]), answer)
        out["format"] = "json"
        extra["inputs"] = [cid]
    elif atype == "data_merge":
        ids = [str(x) for x in p["inputs"]]
        parts = []
        for cid in ids:
            loc = _best(cid, spec, outputs, node.name)
            parts.append((read_chunk(node, settings, client, cid, loc, MAX_READ), loc.get("format")))
        merged, fmt = merge_chunks(parts, p.get("format"))
        out = store_chunk(node, settings, spec["chunk_id"], _tier(p["output_device"]), merged)
        out["format"] = fmt
        extra["inputs"] = ids
    else:
        raise InvalidRequest(f"action type {atype} is not a data action", {"action_type": atype})
    return {**out, **extra, "output": out["chunk_id"]}


def run_action(
    self: Task,
    spec: dict[str, Any],
    p: dict[str, Any],
    client: redis.Redis,
    outputs: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    atype = spec["action_type"]
    if atype == "noop":
        return _noop(self, spec, p, client)
    if atype == "health_check":
        return _health_check(p)
    if atype in DATA_ACTIONS:
        if outputs is None:
            recorded: Any = client.hgetall(OUTPUTS_KEY.format(spec["workflow_id"]))
            outputs = {k.decode(): json.loads(v) for k, v in recorded.items()}
        return run_data_action(self, spec, p, client, outputs)
    node = require_node()
    settings = settings_of(self.app)
    rep = Reporter(self, spec["task_id"], sink=lambda *_: None)
    model = p["model_name"]
    if atype == "download":
        op = op_download(node, settings, spec["task_id"], model, p["source_url"], _tier(p["target_device"]))
    elif atype == "copy" or (atype == "move" and spec.get("source")):
        op = op_copy(node, settings, model, None, _tier(p["target_device"]), spec["source"], p.get("bandwidth_limit"))
    elif atype == "move":
        op = op_move(
            node,
            settings,
            spec["task_id"],
            model,
            None,
            _tier(p["source_device"]),
            _tier(p["target_device"]),
            bool(p.get("keep_source", False)),
        )
    elif atype == "delete":
        op = op_delete(node, model, _tier(p["device"]))
    elif atype == "serve":
        cfg = dict(p.get("config") or {})
        op = op_serve(
            node,
            settings,
            spec["service_id"],
            model,
            None,
            p["device"],
            p.get("port"),
            str(cfg.get("backend", "builtin")),
            cfg,
            bool(spec.get("trust_remote_code")),
        )
    elif atype == "stop_serve":
        op = op_stop(node, p.get("service_id"), model, p.get("device"))
    else:
        raise InvalidRequest(f"action type {atype} cannot run yet", {"action_type": atype})
    body, cleanup = op
    try:
        result = body(rep)
    except BaseException:
        if cleanup is not None:
            cleanup()
        raise
    if atype == "serve":
        result.update(
            service_url=result.get("url"), service_id=spec["service_id"], device=p["device"], output=result.get("url")
        )
    elif "device" in result:
        result.setdefault("output", result["device"])
    return result


@app.task(name="gswarm.node.workflow.step", base=NodeTask, bind=True)
def step(self: Task, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run one workflow action; stop the rest of its chain when it fails or is cancelled.

    The message names the step; its spec (action, parameters, retries, devices) is read from Redis."""
    client = redis_of(self)
    tid = spec["task_id"]
    attempt = int(self.request.retries or 0) + 1
    pipe = client.pipeline(transaction=False)  # one round trip for what a step checks before it starts
    pipe.exists(CANCEL_WF_KEY.format(spec["workflow_id"]), CANCEL_TASK_KEY.format(tid))
    pipe.get(STEP_DONE_KEY.format(tid))
    pipe.hget(SPECS_KEY.format(spec["workflow_id"]), tid)
    cancelled, done, full = pipe.execute()
    if full is not None:
        spec = json.loads(full)
    elif "action_type" not in spec:
        raise TaskFailed(f"step {tid} has no spec in Redis (was it flushed?)", {"task_id": tid})
    if cancelled:
        emit(client, spec, "cancelled", reason="cancelled before it started")
        self.request.chain = None
        return None
    if done is not None:  # a redelivery of a finished step: report again, do nothing again
        previous = json.loads(done)
        emit(client, spec, "succeeded", outputs=previous, redelivered=True)
        return dict(previous)
    try:
        params = spec["params"]
        outputs: dict[str, dict[str, Any]] | None = None
        if "${" in json.dumps(params):
            recorded: Any = client.hgetall(OUTPUTS_KEY.format(spec["workflow_id"]))
            outputs = {k.decode(): json.loads(v) for k, v in recorded.items()}
            params = resolve(params, outputs)
        # A step that waits for its device is not running yet: it reports `started` once it holds it.
        with device_leases(client, spec.get("exclusive") or [], owner=tid, wait=False):
            started_at = time.time()
            # `started` goes out once the step has run a moment; a step quicker than that reports its start
            # inside its `succeeded` event, which halves the events of short steps.
            announce = _announcer().later(
                STARTED_AFTER_S,
                lambda: emit(client, spec, "started", at=started_at, attempt=attempt, worker=self.request.hostname),
            )
            try:
                result = run_action(self, spec, params, client, outputs)
            finally:
                announce.set()  # done already: nothing to announce
            finished_at = time.time()  # still holding the devices: the next holder starts after this
    except Cancelled as exc:
        emit(client, spec, "cancelled", reason=str(exc))
        self.request.chain = None
        return None
    except LeaseBusy:
        # The device is busy: give the worker slot back and come back shortly, same id, same chain, same
        # retry count (waiting is not a failure), far under the visibility timeout.
        self.signature_from_request(countdown=0.05 + random.random() * 0.2).apply_async()
        self.request.chain = None
        raise Ignore() from None
    except (Retry, Ignore):
        raise
    except BaseException as exc:
        permanent = isinstance(exc, InvalidRequest) or (isinstance(exc, GswarmError) and exc.status == 404)
        retries = int(spec.get("retries", 0))
        if not permanent and not isinstance(exc, SoftTimeLimitExceeded) and attempt <= retries:
            base = float(spec.get("retry_backoff", 1.0))
            countdown = min(300.0, base * 2 ** (attempt - 1)) * (0.5 + random.random())
            emit(client, spec, "retrying", attempt=attempt, error=error_dict(exc), countdown_s=round(countdown, 3))
            raise self.retry(exc=exc, countdown=countdown, max_retries=None) from exc
        emit(client, spec, "failed", attempt=attempt, error=error_dict(exc), started_at=time.time())
        self.request.chain = None
        raise
    # Outputs and the done mark are written before the event, in one round trip, so the next step of the
    # chain can resolve its references and a redelivery finds the step done.
    pipe = client.pipeline()
    pipe.hset(OUTPUTS_KEY.format(spec["workflow_id"]), spec["step_id"], json.dumps(_public(result)))
    pipe.expire(OUTPUTS_KEY.format(spec["workflow_id"]), KEEP_S)
    pipe.set(STEP_DONE_KEY.format(tid), json.dumps(result), ex=KEEP_S)
    emit(pipe, spec, "succeeded", at=finished_at, outputs=result, attempt=attempt, started_at=started_at)
    pipe.execute()
    return _public(result)


def _public(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "manifest"}
