"""The workflow document: parse YAML or JSON, validate every action and the graph before anything runs, and
normalize it. One InvalidRequest lists every problem, each naming its action and field. Parsing and the checks are
linear in the document and recursion-free: no aliases, bounded nesting, the graph walked in one pass."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from gswarm_tasks import names
from gswarm_tasks.errors import InvalidRequest

from .actions import OUTPUTS, Action, Errors, check_int, parse_action
from .urls import check_url_fields, node_hosts

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
TOP = {"name", "description", "queue_config", "actions", "fail_fast", "version"}
QUEUE_CONFIG = {"max_concurrent_tasks", "enable_resource_tracking", "resource_tracking", "priority_levels"}
MAX_DOCUMENT_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64
MAX_ACTIONS = 10_000
_YAML = "tag:yaml.org,2002:"
_SCALARS = {_YAML + t for t in ("str", "int", "float", "bool", "null")}
_COLLECTIONS = {None, "!", _YAML + "map", _YAML + "seq"}


@dataclass
class Workflow:
    name: str
    description: str
    queue_config: dict[str, Any]
    fail_fast: bool
    actions: list[Action]

    def by_id(self) -> dict[str, Action]:
        return {a.id: a for a in self.actions}


def _refuse(why: str, event: Any = None) -> InvalidRequest:
    where = f" (line {event.start_mark.line + 1})" if event is not None and event.start_mark is not None else ""
    return InvalidRequest(f"document: {why}{where}", {"field": "document"})


def _scalar(loader: Any, ev: yaml.ScalarEvent) -> Any:
    """A scalar as the safe loader reads it; a date stays the text it was (JSON has none), and only plain tags
    are taken (no merge keys, binaries or sets)."""
    tag = loader.resolve(yaml.ScalarNode, ev.value, ev.implicit) if ev.tag in (None, "!") else ev.tag
    if tag == _YAML + "timestamp":
        return ev.value
    if tag == _YAML + "merge":
        raise _refuse("merge keys (<<) are not allowed", ev)
    if tag not in _SCALARS:
        raise _refuse(f"the tag {tag} is not allowed", ev)
    value = loader.yaml_constructors[tag](loader, yaml.ScalarNode(tag, ev.value, style=ev.style))
    if isinstance(value, float) and not math.isfinite(value):
        raise _refuse(f"{ev.value!r} is not a finite number", ev)
    return value


def _build(loader: Any) -> Any:
    """The document from the parser's events, without recursion: aliases and anchors are refused before anything
    is expanded, and nesting deeper than MAX_DEPTH stops the parse at once."""
    stack: list[tuple[list[Any] | dict[str, Any], list[Any]]] = []  # (container, [pending key] for mappings)
    root: Any = None
    documents = 0
    while loader.check_event():
        ev = loader.get_event()
        if isinstance(ev, yaml.AliasEvent):
            raise _refuse(f"aliases (*{ev.anchor}) are not allowed", ev)
        if getattr(ev, "anchor", None) is not None:
            raise _refuse(f"anchors (&{ev.anchor}) are not allowed", ev)
        if isinstance(ev, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise _refuse("one document only (found a second `---`)", ev)
            continue
        if isinstance(ev, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            stack.pop()
            continue
        if isinstance(ev, yaml.ScalarEvent):
            value: Any = _scalar(loader, ev)
        elif isinstance(ev, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            if ev.tag not in _COLLECTIONS:
                raise _refuse(f"the tag {ev.tag} is not allowed", ev)
            value = [] if isinstance(ev, yaml.SequenceStartEvent) else {}
        else:
            continue  # stream start and end, document end
        if not stack:
            root = value
        else:
            parent, key = stack[-1]
            if isinstance(parent, list):
                parent.append(value)
            elif not key:
                if not isinstance(value, str):
                    raise _refuse("mapping keys must be strings", ev)
                key.append(value)
            else:
                parent[key.pop()] = value
        if isinstance(value, list | dict):
            if len(stack) >= MAX_DEPTH:
                raise _refuse(f"nested deeper than {MAX_DEPTH} levels", ev)
            stack.append((value, []))
    return root


def load_document(text: str | bytes) -> dict[str, Any]:
    """YAML or JSON (JSON is YAML) into a mapping, at most MAX_DOCUMENT_BYTES, without aliases or anchors and
    nested at most MAX_DEPTH deep; anything else is INVALID_REQUEST."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise InvalidRequest(f"document: larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB", {"field": "document"})
    loader = _Loader(text)
    try:
        doc = _build(loader)
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"document: not valid YAML or JSON: {exc}"[:500], {"field": "document"}) from exc
    finally:
        loader.dispose()
    if not isinstance(doc, dict):
        raise InvalidRequest("document: the top level must be a mapping", {"field": "document"})
    return doc


def order_and_cycle(actions: dict[str, Action]) -> tuple[list[str], list[str] | None]:
    """The actions in dependency order (each after everything it depends on, else in listing order), and the first
    dependency cycle found, if any; depth-first without recursion, so any order of any length is fine."""
    order: list[str] = []
    done: set[str] = set()
    cycle: list[str] | None = None
    for root in actions:
        if root in done:
            continue
        path = [root]
        on_path = {root: 0}
        todo = [iter(actions[root].deps)]
        done.add(root)
        while todo:
            for d in todo[-1]:
                if d not in actions:
                    continue
                if d in on_path:
                    if cycle is None:
                        cycle = path[on_path[d] :] + [d]
                    continue
                if d not in done:
                    done.add(d)
                    on_path[d] = len(path)
                    path.append(d)
                    todo.append(iter(actions[d].deps))
                    break
            else:
                todo.pop()
                aid = path.pop()
                del on_path[aid]
                order.append(aid)
    return order, cycle


def reach(
    actions: dict[str, Action], order: list[str], targets: list[str], askers: set[str] | None = None
) -> Iterator[tuple[str, int]]:
    """Per action in `order`: which of `targets` it depends on, directly or not, as bits (bit i: targets[i]).

    One pass in dependency order; an action's bits are dropped once its last dependent has them, so a chain holds
    two at a time. Only the actions in `askers` (all when None) are yielded."""
    index = {t: i for i, t in enumerate(targets)}  # bits made when used: a table of them would be quadratic
    waiting: dict[str, int] = {}
    for aid in order:
        for d in actions[aid].deps:
            if d in actions:
                waiting[d] = waiting.get(d, 0) + 1
    held: dict[str, int] = {}
    for aid in order:
        bits = 0
        for d in actions[aid].deps:
            if d not in actions:
                continue
            bits |= held.get(d, 0)
            if d in index:
                bits |= 1 << index[d]
            waiting[d] -= 1
            if not waiting[d]:
                held.pop(d, None)
        if waiting.get(aid) and bits:
            held[aid] = bits
        if askers is None or aid in askers:
            yield aid, bits


def first_serves(wf: Workflow) -> dict[str, str]:
    """Per inference that names only a model: the first serve of that model (in listing order) it depends on."""
    serves = [a for a in wf.actions if a.type == "serve"]
    askers = {
        a.id: a.params.get("model_name")
        for a in wf.actions
        if a.type == "inference" and not a.params.get("service_url") and not a.params.get("service")
    }
    if not serves or not askers:
        return {}
    masks: dict[Any, int] = {}
    for i, b in enumerate(serves):
        masks[b.params.get("model_name")] = masks.get(b.params.get("model_name"), 0) | 1 << i
    by_id = wf.by_id()
    out = {}
    for aid, bits in reach(by_id, order_and_cycle(by_id)[0], [b.id for b in serves], set(askers)):
        mine = bits & masks.get(askers[aid], 0)
        if mine:
            out[aid] = serves[(mine & -mine).bit_length() - 1].id
    return out


def _check_refs(errors: Errors, actions: dict[str, Action], order: list[str]) -> None:
    """Every `${step.field}` names an action this one depends on and an output that action has. A reference to
    a direct dependency is settled at once; the others are looked up in one `reach` pass."""
    far: dict[str, list[tuple[str, str, str]]] = {}
    for a in actions.values():
        direct = set(a.deps)
        for path, step, fld in a.refs:
            if step not in actions:
                errors.add(path, f"`${{{step}.{fld}}}` names no action of this workflow")
            elif step in direct:
                _check_output(errors, actions[step], path, fld)
            else:
                far.setdefault(a.id, []).append((path, step, fld))
    targets = sorted({step for refs in far.values() for _, step, _ in refs})
    index = {t: i for i, t in enumerate(targets)}
    for aid, bits in reach(actions, order, targets, set(far)):
        for path, step, fld in far[aid]:
            if bits >> index[step] & 1:
                _check_output(errors, actions[step], path, fld)
            else:
                errors.add(path, f"`${{{step}.{fld}}}`: {aid} does not depend on {step}")


def _check_output(errors: Errors, b: Action, path: str, fld: str) -> None:
    custom = (b.params.get("outputs") or {}) if b.type == "noop" else {}
    if fld != "output" and fld not in OUTPUTS[b.type] and fld not in custom:
        errors.add(path, f"`${{{b.id}.{fld}}}`: a {b.type} action has no output {fld!r}")


def validate(doc: dict[str, Any], task_timeout_s: float = 3600) -> Workflow:
    """Check the whole document and return it normalized; raise one InvalidRequest listing every problem."""
    errors = Errors()
    for key in sorted(set(doc) - TOP):
        errors.add(key, "unknown top-level field")
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        errors.add("name", "required (a string up to 200 characters)")
    qc = doc.get("queue_config") or {}
    if not isinstance(qc, dict):
        errors.add("queue_config", "must be a mapping")
        qc = {}
    for key in sorted(set(qc) - QUEUE_CONFIG):
        errors.add(f"queue_config.{key}", "unknown field")
    if "max_concurrent_tasks" in qc:
        check_int(errors, "queue_config.max_concurrent_tasks", qc["max_concurrent_tasks"], 1, 100_000)
    for key in ("enable_resource_tracking", "resource_tracking"):  # the original's switch: always on here
        if key in qc and qc[key] is not True:
            errors.add(f"queue_config.{key}", "always on: a step that loads onto or serves on a GPU holds it (leases)")
    if "priority_levels" in qc and qc["priority_levels"] != list(names.PRIORITY_NAMES):
        errors.add("queue_config.priority_levels", f"the levels are fixed: {', '.join(names.PRIORITY_NAMES)}")
    raw_actions = doc.get("actions")
    if not isinstance(raw_actions, list) or not raw_actions:
        errors.add("actions", "required: a non-empty list")
        raw_actions = []
    if len(raw_actions) > MAX_ACTIONS:
        errors.add("actions", f"at most {MAX_ACTIONS:,} actions")
        errors.raise_if_any()
    actions: dict[str, Action] = {}
    for i, raw in enumerate(raw_actions):
        a = parse_action(errors, i, raw, task_timeout_s)
        if a is None:
            continue
        if a.id in actions:
            errors.add(f"actions[{a.id}].action_id", "duplicate action id")
            continue
        actions[a.id] = a
    for a in actions.values():
        for d in a.deps:
            if d not in actions:
                errors.add(f"actions[{a.id}].dependencies", f"{d!r} is not an action of this workflow")
            if d == a.id:
                errors.add(f"actions[{a.id}].dependencies", "an action cannot depend on itself")
    order, cycle = order_and_cycle(actions)
    if cycle:
        errors.add(f"actions[{cycle[0]}].dependencies", f"dependency cycle: {' -> '.join(cycle)}")
    else:
        node_hosts(errors, actions)  # `http://node1:8080` where a serve starts one: a reference to that serve
        _check_refs(errors, actions, order)
        check_url_fields(errors, actions)
    errors.raise_if_any()
    return Workflow(
        str(name),
        str(doc.get("description") or ""),
        dict(qc),
        bool(doc.get("fail_fast", False)),
        list(actions.values()),
    )
