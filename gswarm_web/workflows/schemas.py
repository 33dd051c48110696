"""The edge of a workflow document: one marshmallow schema per action type, loading an action into a typed, frozen
`document.Action` (devices parsed once into `Device` / `Auto` / `Ref`, references into `Ref`).

Each refusal names the action and the field (`actions[load].target_device: ...`); an unknown field is refused as
one of that action type's (`actions[a].colour: unknown field for a noop action`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import marshmallow as ma

from gswarm_tasks import names
from gswarm_tasks.devices import AUTO, Device, parse_target, safe_name, validate_node_name
from gswarm_tasks.errors import GswarmError

from .actions import ACTION_ID_RE, AUTO_DEFAULTS, CHUNK_FIELDS, DEVICE_FIELDS, FIELDS, Errors, is_auto
from .document import REF_RE, Action, Ref, ServeConfig
from .rules import PLACED, rules
from .serve_config import serve_config

_DEVICE = "a device name is required (<node>:<tier>, or auto)"
_NOT_REF = "`${{{}}}` is not a reference (use ${{action.field}} or ${{action.output.field}})"


def _refused(exc: GswarmError, name: str) -> ma.ValidationError:
    """A refusal of gswarm_tasks' parsers as a field error: its message without the `field: ` it starts with."""
    return ma.ValidationError(exc.message.removeprefix(f"{name}: "))


class _Checked(ma.fields.Field):
    """A field with one message for every way it can be wrong (null included, unless None is allowed)."""

    message = "is not valid"

    def __init__(self, message: str | None = None, **kw: Any) -> None:
        self.message = message or self.message
        super().__init__(error_messages={"null": self.message, "required": self.message}, **kw)

    def fail(self) -> ma.ValidationError:
        return ma.ValidationError(self.message)


class Number(_Checked):
    def __init__(self, lo: float, hi: float, integer: bool = False, **kw: Any) -> None:
        self.lo, self.hi, self.integer = lo, hi, integer
        super().__init__(f"must be {'an integer' if integer else 'a number'} from {lo} to {hi}", **kw)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        kinds = int if self.integer else int | float
        if isinstance(value, bool) or not isinstance(value, kinds) or not self.lo <= value <= self.hi:
            raise self.fail()
        return value if self.integer else float(value)


class Is(_Checked):
    """A value `ok` accepts, kept as it is."""

    def __init__(self, ok: Callable[[Any], bool], message: str, **kw: Any) -> None:
        self.ok = ok
        super().__init__(message, **kw)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        if not self.ok(value):
            raise self.fail()
        return value


def Choice(choices: tuple[Any, ...], message: str, **kw: Any) -> Is:  # noqa: N802 (a field, as marshmallow's are)
    return Is(lambda v: v in choices, message, **kw)


def Text(longest: int, **kw: Any) -> Is:  # noqa: N802
    return Is(
        lambda v: isinstance(v, str) and bool(v.strip()) and len(v) <= longest,
        f"required (a string up to {longest} characters)",
        **kw,
    )


def Mapping() -> Is:  # noqa: N802
    return Is(lambda v: isinstance(v, dict), "must be a mapping")


class Target(_Checked):
    """A device field: `<node>:<tier>[:<index>]` as a `Device`, `auto[:<kind>]` as an `Auto` where placement fills
    the field, or one whole reference as a `Ref`."""

    message = _DEVICE

    def __init__(self, auto: bool = True, refs: bool = True, **kw: Any) -> None:
        self.auto, self.refs = auto, refs
        super().__init__(**kw)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        name = attr or "device"
        if not isinstance(value, str):
            raise self.fail()
        if self.refs and "${" in value:
            return _whole_ref(value, "a device name, auto, or one reference ${action.field}")
        try:
            if is_auto(value):
                if not self.auto:
                    raise ma.ValidationError(
                        "placement does not choose this device: name one (<node>:<tier>)"
                    )
                return parse_target(value, name)
            dev = Device.parse(value, field=name)
        except GswarmError as exc:
            raise _refused(exc, name) from None
        if dev.node is None:
            raise ma.ValidationError("`web` is not a device an action can use")
        return dev


def _whole_ref(value: str, otherwise: str) -> Ref:
    ref = Ref.whole(value)
    if ref is not None:
        return ref
    m = REF_RE.fullmatch(value)
    raise ma.ValidationError(_NOT_REF.format(m.group(1)) if m is not None else otherwise)


class Chunk(ma.fields.Raw):
    """A field naming one chunk: its id, or one whole reference (`${make.chunk_id}`) as a `Ref`."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        if isinstance(value, str) and "${" in value:
            return _whole_ref(value, "a chunk id, or one reference ${action.chunk_id}")
        return value


class Chunks(_Checked):
    message = "must be a non-empty list"

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        if not isinstance(value, list):
            raise self.fail()
        one = Chunk()
        return [one.deserialize(v) for v in value]


class ModelName(_Checked):
    message = "must be a model name"

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        if not isinstance(value, str):
            raise self.fail()
        if value and not REF_RE.search(value):
            try:
                safe_name(value, "model_name")
            except GswarmError as exc:
                raise _refused(exc, "model_name") from None
        return value


class NodeName(_Checked):
    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        try:
            return validate_node_name(value, "node")
        except GswarmError as exc:
            raise _refused(exc, "node") from None


class Dependencies(_Checked):
    message = "must be a list of action ids"

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
            raise self.fail()
        if len(set(value)) != len(value):
            raise ma.ValidationError("lists an action twice")
        return tuple(value)


class Exclusive(_Checked):
    message = "must be a list of devices"

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> Any:
        if not isinstance(value, list):
            raise self.fail()
        one, out, problems = Target(auto=False, refs=False), [], {}
        for j, v in enumerate(value):
            try:
                out.append(one.deserialize(v, f"exclusive[{j}]"))
            except ma.ValidationError as exc:
                problems[j] = exc.messages
        if problems:
            raise ma.ValidationError(problems)
        return tuple(out)


class Serving(ma.fields.Field):
    """A serve action's `config`: a preset of the node and its documented parameters, never a command."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kw: Any) -> ServeConfig:
        config, own, problems = serve_config(value)
        if problems:
            nested: dict[str, Any] = {}
            for where, message in problems:
                key = where.removeprefix("config").removeprefix(".") or "_schema"
                nested.setdefault(key, []).append(message)
            raise ma.ValidationError(nested)
        return ServeConfig(config or {}, own)


_DATA_TYPES = ("input", "output", "intermediate")


def _field(atype: str, key: str) -> ma.fields.Field:
    if key in DEVICE_FIELDS:
        return Target(auto=key in PLACED.get(atype, ()))
    if key == "model_name" and atype != "inference":
        return ModelName()
    if key in CHUNK_FIELDS:
        return Chunk(allow_none=True)
    kinds: dict[str, ma.fields.Field] = {
        "port": Number(1024, 65535, integer=True),
        "bandwidth_limit": Number(1, 10**13, integer=True),
        "duration_s": Number(0, 86400),
        "fail_times": Number(0, 100, integer=True),
        "outputs": Mapping(),
        "metadata": Mapping(),
        "data_type": Choice(_DATA_TYPES, "must be input, output or intermediate"),
        "inputs": Chunks(),
        "config": Serving(),
    }
    if atype == "data_merge" and key == "format":
        return Choice((None, "json", "concat"), "must be json or concat", allow_none=True)
    return kinds.get(key) or ma.fields.Raw(allow_none=True)


class ActionSchema(ma.Schema):
    """What every action type has; `_schema` adds the type's own fields."""

    atype = "noop"
    action_id = ma.fields.Raw()
    action_type = ma.fields.Raw()
    dependencies = Dependencies(allow_none=True)
    priority = Choice(names.PRIORITY_NAMES, f"must be one of {', '.join(names.PRIORITY_NAMES)}")
    retries = Number(0, 20, integer=True)
    retry_backoff = Number(0, 600)
    node = NodeName(allow_none=True)
    description = ma.fields.Raw(allow_none=True)
    exclusive = Exclusive(allow_none=True)

    @ma.pre_load
    def _normalize(self, raw: dict[str, Any], **kw: Any) -> dict[str, Any]:
        raw = _devices(self.atype, dict(raw))
        try:
            node = validate_node_name(raw["node"]) if raw.get("node") is not None else None
        except GswarmError:
            node = None
        target_node = raw.get("target_node")
        if self.atype == "data_transfer" and isinstance(target_node, str) and "${" not in target_node:
            raw["target_device"] = raw.get("target_device") or "dram"
            node = target_node
        for key in DEVICE_FIELDS:  # a bare tier (`gpu0`) is on the action's node
            value = raw.get(key)
            if (
                isinstance(value, str)
                and value
                and ":" not in value
                and "${" not in value
                and not is_auto(value)
            ):
                raw[key] = f"{node}:{value}" if node is not None else value
        for key in AUTO_DEFAULTS.get(self.atype, ()):
            if raw.get(key) is None:
                raw[key] = AUTO  # an omitted device: placement chooses it at submission
        if self.atype == "serve":
            raw.setdefault("config", {})
        return raw

    @ma.validates_schema
    def _rules(self, data: dict[str, Any], **kw: Any) -> None:
        problems: dict[str, list[str]] = {}
        for key, message in rules(self.atype, data):
            problems.setdefault(key, []).append(message)
        if problems:
            raise ma.ValidationError(problems)


def _devices(atype: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The original `devices: [from, to]` form and the `source_device` / `target_device` form become one."""
    devices = raw.pop("devices", None)
    if devices is None:
        devices = []
    if not isinstance(devices, list):
        raise ma.ValidationError({"devices": ["must be a list of device names"]})
    if atype == "download":
        if devices and "target_device" not in raw:
            raw["target_device"] = devices[0]
    elif atype in ("move", "copy"):
        if len(devices) == 2:
            raw.setdefault("source_device", devices[0])
            raw.setdefault("target_device", devices[1])
        elif devices:
            raise ma.ValidationError({"devices": ["a move or copy takes [from, to]"]})
    elif atype in ("serve", "stop_serve", "delete"):
        if devices and "device" not in raw and "target_device" not in raw:
            raw["device"] = devices[0]
        if atype == "delete" and "target_device" in raw and "device" not in raw:
            raw["device"] = raw.pop("target_device")
    elif devices and atype != "health_check" and len(devices) > 1:
        raise ma.ValidationError({"devices": ["takes at most one device"]})
    return raw


@lru_cache(maxsize=64)
def _schema(atype: str, task_timeout_s: float) -> ActionSchema:
    attrs: dict[str, Any] = {key: _field(atype, key) for key in sorted(FIELDS[atype])}
    attrs.update(atype=atype, error_messages={"unknown": f"unknown field for a {atype} action"})
    attrs["timeout_s"] = Number(1, task_timeout_s, allow_none=True)
    cls = type(f"{atype.title().replace('_', '')}Schema", (ActionSchema,), attrs)
    return cls()


def flatten(where: str, messages: Any) -> Iterator[tuple[str, str]]:
    """marshmallow's nested messages as (`actions[a].field.key[0]`, message), in the order they were found."""
    if isinstance(messages, dict):
        for key, value in messages.items():
            sub = (
                where if key == "_schema" else f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}"
            )
            sub = sub.removeprefix(".")
            yield from flatten(sub, value)
    elif isinstance(messages, list):
        for m in messages:
            yield from flatten(where, m) if isinstance(m, dict | list) else [(where, str(m))]
    else:
        yield where, str(messages)


def _ref_texts(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every `${...}` in a value (strings, lists, mappings) with the field path it sits in."""
    if isinstance(value, str):
        yield from ((path, m.group(1)) for m in REF_RE.finditer(value))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _ref_texts(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _ref_texts(v, f"{path}.{k}")


def parse_action(errors: Errors, i: int, raw: Any, task_timeout_s: float) -> tuple[str | None, Action | None]:
    """(the action's id when it has one, the action when nothing about it is refused)."""
    if not isinstance(raw, dict):
        errors.add(f"actions[{i}]", "must be a mapping")
        return None, None
    aid = raw.get("action_id")
    if not isinstance(aid, str) or not ACTION_ID_RE.match(aid):
        errors.add(f"actions[{i}].action_id", "required: letters, digits, _ . - (up to 64)")
        return None, None
    where = f"actions[{aid}]"
    atype = raw.get("action_type")
    if atype not in FIELDS:
        errors.add(
            f"{where}.action_type", f"unknown action type {atype!r} (one of: {', '.join(sorted(FIELDS))})"
        )
        return aid, None
    try:
        data = _schema(atype, task_timeout_s).load(raw)
    except ma.ValidationError as exc:
        for path, message in flatten(where, exc.messages):
            errors.add(path, message)
        return aid, None
    fields = {k: v for k, v in data.items() if k in FIELDS[atype]}
    action = Action(
        aid,
        atype,
        data.get("dependencies") or (),
        fields,
        data.get("priority", "normal"),
        data.get("retries", 0),
        data.get("retry_backoff", 1.0),
        data.get("timeout_s"),
        data.get("node"),
        tuple(data.get("exclusive") or ()),
    ).with_fields()  # a GPU it loads onto or serves on is held
    sites = []
    for path, expr in _ref_texts(action.params, where):
        ref = Ref.parse(expr)
        if ref is None:
            errors.add(path, _NOT_REF.format(expr))
        else:
            sites.append((path, ref))
    return aid, dataclasses.replace(action, ref_sites=tuple(sites))
