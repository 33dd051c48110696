"""The action types of a workflow: their fields, their outputs, and the checks of one action.

Errors name the action and the field: `actions[load_gpu].target_device: 'node1:gpuX' has unknown tier`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gswarm_tasks import names
from gswarm_tasks.devices import AUTO, Device, parse_target, safe_name, validate_node_name
from gswarm_tasks.errors import GswarmError, InvalidRequest

from .serve_config import serve_config

ACTION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
REF_RE = re.compile(r"\$\{([^}]*)\}")
MODEL_ACTIONS = ("download", "move", "copy", "delete", "serve", "stop_serve")
DATA_ACTIONS = ("data_create", "data_move", "data_transfer", "inference", "data_merge")
AVAILABLE = frozenset({*MODEL_ACTIONS, *DATA_ACTIONS, "health_check", "noop"})
CHUNK_FIELDS = ("data_id", "input_data", "input_data_id", "input")  # fields that name one chunk
# Device fields that may be left out (or written `auto` / `auto:<kind>`): placement fills them at submission.
AUTO_DEFAULTS: dict[str, tuple[str, ...]] = {
    "download": ("target_device",),
    "move": ("source_device", "target_device"),
    "copy": ("source_device", "target_device"),
    "serve": ("device",),
    "data_create": ("target_device",),
    "inference": ("output_device",),
    "data_merge": ("output_device",),
}

COMMON = {
    "action_id",
    "action_type",
    "dependencies",
    "devices",
    "priority",
    "retries",
    "retry_backoff",
    "timeout_s",
    "node",
    "description",
    "exclusive",
}
# Fields of each action type, and the outputs later actions may reference as ${action.field}.
FIELDS: dict[str, set[str]] = {
    "download": {"model_name", "source_url", "target_device", "model_type", "verify_checksum"},
    "move": {"model_name", "source_device", "target_device", "keep_source", "verify_checksum"},
    "copy": {"model_name", "source_device", "target_device", "bandwidth_limit"},
    "delete": {"model_name", "device", "target_device"},
    "serve": {"model_name", "device", "port", "config"},
    "stop_serve": {"model_name", "device", "service_id"},
    "health_check": {"target_url", "expected_status", "timeout"},
    "noop": {"duration_s", "fail_times", "outputs"},
    "data_create": {"source", "data", "data_type", "format", "target_device", "metadata"},
    "data_move": {"data_id", "target_device"},
    "data_transfer": {"data_id", "target_node", "target_device", "delete_source"},
    "inference": {
        "model_name",
        "service_url",
        "service",
        "endpoint",
        "input_data",
        "input_data_id",
        "input",
        "output_device",
        "data_type",
        "metadata",
    },
    "data_merge": {"inputs", "output_device", "format", "data_type", "metadata"},
}
DATA_OUTPUTS = {"chunk_id", "device", "size", "checksum", "path"}
OUTPUTS: dict[str, set[str]] = {
    "download": {"device", "path", "size_bytes"},
    "move": {"device", "path", "size_bytes"},
    "copy": {"device", "path", "size_bytes"},
    "delete": {"device"},
    "serve": {"service_url", "service_id", "port", "device"},
    "stop_serve": {"service_id"},
    "health_check": {"status_code", "url"},
    "noop": set(),
    "data_create": DATA_OUTPUTS,
    "data_move": DATA_OUTPUTS,
    "data_transfer": DATA_OUTPUTS,
    "inference": DATA_OUTPUTS,
    "data_merge": DATA_OUTPUTS,
}


@dataclass
class Action:
    """One normalized action: where it runs, what it needs exclusively, what it references."""

    id: str
    type: str
    deps: list[str]
    params: dict[str, Any]
    priority: str = "normal"
    retries: int = 0
    retry_backoff: float = 1.0
    timeout_s: float | None = None
    node: str | None = None
    exclusive: list[str] = field(default_factory=list)
    refs: list[tuple[str, str, str]] = field(default_factory=list)  # (field, step, output field)


class Errors:
    """Every problem of a document, each naming its action and field; raised together."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, where: str, message: str) -> None:
        self.items.append({"field": where, "message": message})

    def check(self, where: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except GswarmError as exc:
            self.add(
                where, exc.message.split(": ", 1)[-1] if exc.message.startswith(where.split(".")[-1]) else exc.message
            )
            return None

    def raise_if_any(self) -> None:
        if self.items:
            first = self.items[0]
            more = f" (and {len(self.items) - 1} more)" if len(self.items) > 1 else ""
            raise InvalidRequest(f"{first['field']}: {first['message']}{more}", {"errors": self.items})


def _device(errors: Errors, where: str, value: Any, default_node: str | None = None) -> str | None:
    if not isinstance(value, str):
        errors.add(where, "a device name is required (<node>:<tier>, or auto)")
        return None
    if is_auto(value):  # placement chooses it at submission
        target = errors.check(where, lambda: parse_target(value, where.rsplit(".", 1)[-1]))
        return str(target) if target is not None else None
    dev = errors.check(where, lambda: Device.parse(value, field=where, default_node=default_node))
    if dev is not None and dev.node is None:
        errors.add(where, "`web` is not a device an action can use")
        return None
    return str(dev) if dev is not None else None


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and (value == AUTO or value.startswith(AUTO + ":"))


def _is_device(value: Any) -> TypeGuard[str]:
    """A device name that was checked (normalized): not a reference resolved when the step runs, not `auto`."""
    return isinstance(value, str) and "${" not in value and ":" in value and not is_auto(value)


def _normalize_devices(errors: Errors, where: str, atype: str, raw: dict[str, Any], node: str | None) -> None:
    """The original `devices: [from, to]` form and the `source_device` / `target_device` form become one."""
    devices = raw.pop("devices", None)
    if devices is None:
        devices = []
    if not isinstance(devices, list):
        errors.add(f"{where}.devices", "must be a list of device names")
        return
    if atype in ("download",):
        if devices and "target_device" not in raw:
            raw["target_device"] = devices[0]
    elif atype in ("move", "copy"):
        if len(devices) == 2:
            raw.setdefault("source_device", devices[0])
            raw.setdefault("target_device", devices[1])
        elif devices:
            errors.add(f"{where}.devices", "a move or copy takes [from, to]")
    elif atype in ("serve", "stop_serve", "delete"):
        if devices and "device" not in raw and "target_device" not in raw:
            raw["device"] = devices[0]
        if atype == "delete" and "target_device" in raw and "device" not in raw:
            raw["device"] = raw.pop("target_device")
    elif devices and atype not in ("health_check",) and len(devices) > 1:
        errors.add(f"{where}.devices", "takes at most one device")
    for key in ("source_device", "target_device", "device", "output_device"):
        if key in raw and not REF_RE.search(str(raw[key])):
            tier_only = isinstance(raw[key], str) and ":" not in raw[key]
            raw[key] = _device(errors, f"{where}.{key}", raw[key], node if tier_only else None)


def check_int(errors: Errors, where: str, value: Any, lo: int, hi: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        errors.add(where, f"must be an integer from {lo} to {hi}")
        return None
    return value


def check_num(errors: Errors, where: str, value: Any, lo: float, hi: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        errors.add(where, f"must be a number from {lo} to {hi}")
        return None
    return float(value)


def _refs(value: Any, path: str) -> list[tuple[str, str]]:
    """Every `${...}` in a value (strings, lists, mappings) with the field path it sits in."""
    out: list[tuple[str, str]] = []
    if isinstance(value, str):
        out.extend((path, m.group(1)) for m in REF_RE.finditer(value))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_refs(v, f"{path}[{i}]"))
    elif isinstance(value, dict):
        for k, v in value.items():
            out.extend(_refs(v, f"{path}.{k}"))
    return out


def parse_ref(expr: str) -> tuple[str, str] | None:
    """`step.field`, `step.output.field` or `step.output` -> (step, field); `output` means the main output."""
    parts = expr.strip().split(".")
    if len(parts) == 2:
        return parts[0], parts[1]
    if len(parts) == 3 and parts[1] == "output":
        return parts[0], parts[2]
    return None


def _target_on_node(errors: Errors, where: str, raw: dict[str, Any], node: str) -> None:
    """`target_node: node2` with `target_device: dram` (or none) is `node2:dram`; another node's device is refused."""
    td = raw.get("target_device") or "dram"
    if not isinstance(td, str) or "${" in td:
        return
    dev = errors.check(f"{where}.target_device", lambda: Device.parse(td, f"{where}.target_device", default_node=node))
    if dev is not None and dev.node != node:
        errors.add(f"{where}.target_device", f"{td!r} is not on target_node {node!r}")
    elif dev is not None:
        raw["target_device"] = str(dev)


def parse_action(errors: Errors, i: int, raw: Any, default_task_timeout: float) -> Action | None:
    if not isinstance(raw, dict):
        errors.add(f"actions[{i}]", "must be a mapping")
        return None
    aid = raw.get("action_id")
    if not isinstance(aid, str) or not ACTION_ID_RE.match(aid):
        errors.add(f"actions[{i}].action_id", "required: letters, digits, _ . - (up to 64)")
        return None
    where = f"actions[{aid}]"
    atype = raw.get("action_type")
    if atype not in FIELDS:
        errors.add(f"{where}.action_type", f"unknown action type {atype!r} (one of: {', '.join(sorted(FIELDS))})")
        return None
    raw = dict(raw)
    unknown = sorted(set(raw) - COMMON - FIELDS[atype])
    for key in unknown:
        errors.add(f"{where}.{key}", f"unknown field for a {atype} action")
    node = raw.get("node")
    if node is not None:
        node = errors.check(f"{where}.node", lambda: validate_node_name(node, f"{where}.node"))
    if atype == "data_transfer" and isinstance(raw.get("target_node"), str) and "${" not in raw["target_node"]:
        _target_on_node(errors, where, raw, raw["target_node"])
    _normalize_devices(errors, where, atype, raw, node)
    for key in AUTO_DEFAULTS.get(atype, ()):
        if raw.get(key) is None:
            raw[key] = AUTO  # an omitted device: placement chooses it at submission
    deps = raw.get("dependencies") or []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        errors.add(f"{where}.dependencies", "must be a list of action ids")
        deps = []
    if len(set(deps)) != len(deps):
        errors.add(f"{where}.dependencies", "lists an action twice")
    priority = raw.get("priority", "normal")
    if priority not in names.PRIORITY_NAMES:
        errors.add(f"{where}.priority", f"must be one of {', '.join(names.PRIORITY_NAMES)}")
        priority = "normal"
    retries = check_int(errors, f"{where}.retries", raw.get("retries", 0), 0, 20) or 0
    backoff = check_num(errors, f"{where}.retry_backoff", raw.get("retry_backoff", 1.0), 0, 600) or 0.0
    timeout = raw.get("timeout_s")
    if timeout is not None:
        timeout = check_num(errors, f"{where}.timeout_s", timeout, 1, default_task_timeout)
    params = {k: v for k, v in raw.items() if k in FIELDS[atype]}
    _check_params(errors, where, atype, params)
    exclusive = raw.get("exclusive") or []
    if not isinstance(exclusive, list):
        errors.add(f"{where}.exclusive", "must be a list of devices")
        exclusive = []
    exclusive = [d for j, e in enumerate(exclusive) if (d := _device(errors, f"{where}.exclusive[{j}]", e))]
    for key in ("target_device", "device"):  # a move to or a serve on a GPU holds that GPU
        dev = params.get(key)
        if atype in ("download", "move", "copy", "serve") and _is_device(dev) and Device.parse(dev).is_gpu:
            exclusive.append(dev)
    refs = []
    for path, expr in _refs(params, where):
        parsed = parse_ref(expr)
        if parsed is None:
            errors.add(path, f"`${{{expr}}}` is not a reference (use ${{action.field}} or ${{action.output.field}})")
        else:
            refs.append((path, parsed[0], parsed[1]))
    return Action(
        aid, atype, list(deps), params, priority, retries, backoff, timeout, node, sorted(set(exclusive)), refs
    )


def _check_params(errors: Errors, where: str, atype: str, p: dict[str, Any]) -> None:
    def need(*keys: str) -> None:
        for k in keys:
            if p.get(k) in (None, ""):
                errors.add(f"{where}.{k}", f"required for a {atype} action")

    if atype in MODEL_ACTIONS:
        need("model_name")
        if isinstance(p.get("model_name"), str) and not REF_RE.search(p["model_name"]):
            errors.check(f"{where}.model_name", lambda: safe_name(p["model_name"], f"{where}.model_name"))
    if atype == "download":
        need("target_device")
    elif atype in ("move", "copy"):
        need("source_device", "target_device")
        if atype == "copy" and "bandwidth_limit" in p:
            check_int(errors, f"{where}.bandwidth_limit", p["bandwidth_limit"], 1, 10**13)
    elif atype in ("serve", "delete"):
        need("device")
        if "port" in p:
            check_int(errors, f"{where}.port", p["port"], 1024, 65535)
        if "config" in p and not isinstance(p["config"], dict):
            errors.add(f"{where}.config", "must be a mapping")
        elif atype == "serve":
            _check_serve_config(errors, where, p)
    elif atype == "stop_serve":
        if not p.get("device") and not p.get("service_id"):
            errors.add(f"{where}.device", "required (or service_id) for a stop_serve action")
    elif atype == "health_check":
        need("target_url")  # its form is checked by `urls.check_url_fields`
    elif atype == "noop":
        if "duration_s" in p:
            check_num(errors, f"{where}.duration_s", p["duration_s"], 0, 86400)
        if "fail_times" in p:
            check_int(errors, f"{where}.fail_times", p["fail_times"], 0, 100)
        if "outputs" in p and not isinstance(p["outputs"], dict):
            errors.add(f"{where}.outputs", "must be a mapping")
    elif atype == "data_create":
        if not p.get("source") and p.get("data") is None:
            errors.add(f"{where}.source", "required (or data) for a data_create action")
        need("target_device")
        if p.get("data_type", "input") not in ("input", "output", "intermediate"):
            errors.add(f"{where}.data_type", "must be input, output or intermediate")
    elif atype in ("data_move", "data_transfer"):
        need("data_id")
        if atype == "data_move":
            need("target_device")
        elif not p.get("target_device") and not p.get("target_node"):
            errors.add(f"{where}.target_device", "required (or target_node) for a data_transfer action")
    elif atype == "inference":
        if not any(p.get(k) for k in ("input_data", "input_data_id", "input")):
            errors.add(f"{where}.input_data", "required (input_data, input_data_id or input)")
        if not any(p.get(k) for k in ("service_url", "service", "model_name")):
            errors.add(f"{where}.service_url", "required (service_url, service or model_name)")
        need("output_device")
    elif atype == "data_merge":
        if not isinstance(p.get("inputs"), list) or not p["inputs"]:
            errors.add(f"{where}.inputs", "must be a non-empty list")
        need("output_device")
        if p.get("format") not in (None, "json", "concat"):
            errors.add(f"{where}.format", "must be json or concat")
    if atype in DATA_ACTIONS:
        for key in ("target_device", "output_device"):
            dev = p.get(key)
            if _is_device(dev) and not Device.parse(dev).is_file_tier:
                errors.add(f"{where}.{key}", f"{dev!r} is not a data tier: chunks live on a node's disk or dram")
        if atype in ("inference", "data_merge") and p.get("data_type", "intermediate") not in (
            "input",
            "output",
            "intermediate",
        ):
            errors.add(f"{where}.data_type", "must be input, output or intermediate")
        if "metadata" in p and not isinstance(p["metadata"], dict):
            errors.add(f"{where}.metadata", "must be a mapping")


def _check_serve_config(errors: Errors, where: str, p: dict[str, Any]) -> None:
    """A serve action names a preset and its documented parameters (kept as `backend` + params), never a command;
    the service's own keys go to `service_config`."""
    config, own, problems = serve_config(p.get("config") or {})
    for field_, message in problems:
        errors.add(f"{where}.{field_}", message)
    if config is not None:
        p["config"] = config
    if own:
        p["service_config"] = own
