"""What each workflow action does on a node: model operations, data actions, health checks and no-ops.

`run_action` runs one action with its references resolved; the step task (`step_task`) wraps it in the
workflow protocol (cancellation, device leases, retries, reports).
"""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Any

import redis
from celery import Task

from .. import names
from ..celery_app import settings_of
from ..context import require_node
from ..data.chunks import copy_chunk, read_chunk, store_chunk
from ..data.compute import merge_chunks, run_inference
from ..devices import Device
from ..errors import Cancelled, InvalidRequest, NotFound, TaskFailed
from ..models.tasks import op_copy, op_delete, op_download, op_move
from ..reporting import Reporter
from ..serving.engines import key_headers
from ..serving.keys import key_for
from ..serving.tasks import op_serve, op_stop
from ..urls import Allow, fetch, parse_url, service_ref

REF_RE = re.compile(r"\$\{([^}]*)\}")
DATA_ACTIONS = ("data_create", "data_move", "data_transfer", "inference", "data_merge")
MAX_READ = 1 << 30  # chunks an inference or a merge reads whole


def is_cancelled(client: redis.Redis, spec: dict[str, Any]) -> bool:
    return bool(
        client.exists(names.cancel_workflow_key(spec["workflow_id"]), names.cancel_task_key(spec["task_id"]))
    )


def recorded_outputs(client: redis.Redis, workflow_id: str) -> dict[str, dict[str, Any]]:
    """Outputs of the workflow's finished steps, as they wrote them to Redis."""
    recorded: Any = client.hgetall(names.workflow_outputs_key(workflow_id))
    return {k.decode(): json.loads(v) for k, v in recorded.items()}


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
            raise InvalidRequest(
                f"${{{expr}}} has no value: {step} recorded {sorted(out or {})}", {"reference": expr}
            )
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
        raise TaskFailed(
            f"noop asked to fail {failures} time(s)", {"attempt": int(self.request.retries or 0) + 1}
        )
    deadline = time.monotonic() + float(p.get("duration_s", 0))
    while time.monotonic() < deadline:
        if is_cancelled(client, spec):
            raise Cancelled("cancelled while running")
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return dict(p.get("outputs") or {})


def workflow_allow(self: Task, spec: dict[str, Any], key: str, outputs: dict[str, Any] | None) -> Allow:
    """Where a health check or an inference may go: a replica the control plane named at submission
    (`allowed_origins`), the service a serve step of this workflow started (`${serve.service_url}`), or a host in
    the node's own workflows.allowed_hosts."""
    origins = list(spec.get("allowed_origins") or [])
    ref = service_ref((spec.get("params") or {}).get(key))
    started = (outputs or {}).get(ref[0]) if ref else None
    if started and started.get("service_url"):
        origins.append(parse_url(started["service_url"], key).origin)
    return Allow.of(settings_of(self.app).workflows_allowed_hosts, "workflows.allowed_hosts", origins)


def _health_check(
    self: Task, spec: dict[str, Any], p: dict[str, Any], outputs: dict[str, Any] | None
) -> dict:
    url = parse_url(p["target_url"], "target_url")
    allow = workflow_allow(self, spec, "target_url", outputs)
    with fetch(url, allow, "target_url", timeout=(float(p.get("timeout", 10)),) * 2) as r:
        status = r.status
    want = int(p.get("expected_status", 200))
    if status != want:
        raise TaskFailed(f"health check of {url} answered {status}, expected {want}", {"url": str(url)})
    return {"status_code": status, "url": str(url), "output": str(url)}


def _chunk_locations(
    chunk_id: str, spec: dict[str, Any], outputs: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Where a chunk is, as far as this workflow knows: copies its steps made (less those a move removed),
    and the copies the control plane listed at submission for chunks named literally."""
    mine = [o for o in outputs.values() if o.get("chunk_id") == chunk_id]
    removed = {o.get("source_device") for o in mine if o.get("source_removed")}
    locs = [o for o in mine if o.get("device") and (o.get("blake3") or o.get("checksum"))]
    locs += list((spec.get("chunks") or {}).get(chunk_id) or [])
    return [loc for loc in locs if loc["device"] not in removed]


def _best(
    chunk_id: str, spec: dict[str, Any], outputs: dict[str, Any], node: str, same_node: bool = False
) -> Any:
    locs = _chunk_locations(chunk_id, spec, outputs)
    devs = {loc["device"]: Device.parse(loc["device"]) for loc in locs}
    locs.sort(key=lambda loc: (devs[loc["device"]].node != node, devs[loc["device"]].tier != "dram"))
    if same_node:
        locs = [loc for loc in locs if devs[loc["device"]].node == node]
    if not locs:
        where = f" on {node}" if same_node else ""
        raise NotFound(f"chunk {chunk_id} has no copy{where} this step knows of", {"chunk_id": chunk_id})
    return locs[0]


def run_data_action(
    self: Task, spec: dict[str, Any], p: dict[str, Any], client: redis.Redis, outputs: dict[str, Any]
) -> dict[str, Any]:
    """data_create, data_move, data_transfer, inference, data_merge: each ends with one verified chunk copy."""
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
        source = {
            "node": src.node,
            "tier": src.tier,
            "address": loc.get("address"),
            "port": loc.get("file_port"),
        }
        delete_source = bool(p.get("delete_source"))
        remove = atype == "data_move" or (delete_source and src.node == node.name)
        out = copy_chunk(
            node, settings, client, spec["task_id"], cid, _tier(p["target_device"]), source, loc, remove
        )
        out["format"] = loc.get("format")
        extra["delete_source"] = delete_source
    elif atype == "inference":
        cid = str(p.get("input_data") or p.get("input_data_id") or p.get("input"))
        loc = _best(cid, spec, outputs, node.name)
        data = read_chunk(node, settings, client, cid, loc, MAX_READ)
        field = "service_url" if p.get("service_url") else "service"
        url = str(p.get(field))
        allow = workflow_allow(self, spec, field, outputs)
        key = key_headers(key_for(client, url))  # a replica answers only with its service key
        endpoint = str(p.get("endpoint") or "/v1/embeddings")
        answer = run_inference(url, endpoint, p.get("model_name"), data, cid, key, allow=allow, field=field)
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
        return _health_check(self, spec, p, outputs)
    if atype in DATA_ACTIONS:
        if outputs is None:
            outputs = recorded_outputs(client, spec["workflow_id"])
        return run_data_action(self, spec, p, client, outputs)
    node = require_node()
    settings = settings_of(self.app)
    rep = Reporter(self, spec["task_id"], sink=lambda *_: None)
    model = p["model_name"]
    if atype == "download":
        op = op_download(node, settings, spec["task_id"], model, p["source_url"], _tier(p["target_device"]))
    elif atype == "copy" or (atype == "move" and spec.get("source")):
        op = op_copy(
            node, settings, spec["task_id"], model, None, _tier(p["target_device"]), spec["source"],
            p.get("bandwidth_limit"),
        )  # fmt: skip
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
            service_url=result.get("url"),
            service_id=spec["service_id"],
            device=p["device"],
            output=result.get("url"),
        )
    elif "device" in result:
        result.setdefault("output", result["device"])
    return result
