"""The workflow document: parse YAML or JSON, validate every action and the graph before anything runs, and
normalize it. One InvalidRequest lists every problem, each naming its action and field. Parsing and the checks are
linear in the document and recursion-free: no aliases, bounded nesting, the graph walked in one pass."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import marshmallow as ma
import yaml

from gswarm_tasks import names
from gswarm_tasks.errors import InvalidRequest

from ..scheduling.documents import parse_yaml
from .actions import OUTPUTS, Errors
from .document import Action, Workflow
from .schemas import Choice, Number, Text, flatten
from .shapes import Shapes
from .urls import check_url_fields, node_hosts

MAX_DOCUMENT_BYTES = 8 * 1024 * 1024
MAX_ACTIONS = 10_000


class QueueConfigSchema(ma.Schema):
    error_messages = {"unknown": "unknown field"}
    max_concurrent_tasks = Number(1, 100_000, integer=True)
    # The original's switches: always on here.
    enable_resource_tracking = Choice(
        (True,), "always on: a step that loads onto or serves on a GPU holds it (leases)"
    )
    resource_tracking = Choice(
        (True,), "always on: a step that loads onto or serves on a GPU holds it (leases)"
    )
    priority_levels = Choice(
        (list(names.PRIORITY_NAMES),), f"the levels are fixed: {', '.join(names.PRIORITY_NAMES)}"
    )


class WorkflowSchema(ma.Schema):
    """The document's top level; its actions are loaded one by one by their type's schema (`schemas`)."""

    error_messages = {"unknown": "unknown top-level field"}
    name = Text(200, required=True)
    description = ma.fields.Raw(allow_none=True)
    queue_config = ma.fields.Nested(
        QueueConfigSchema, allow_none=True, error_messages={"type": "must be a mapping"}
    )
    actions = ma.fields.Raw(allow_none=True)
    fail_fast = ma.fields.Raw(allow_none=True)
    version = ma.fields.Raw(allow_none=True)


_TOP = WorkflowSchema()


def load_document(text: str | bytes) -> dict[str, Any]:
    """YAML or JSON (JSON is YAML) into a mapping, at most MAX_DOCUMENT_BYTES, without aliases or anchors and
    nested at most MAX_DEPTH deep; anything else is INVALID_REQUEST."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise InvalidRequest(
            f"document: larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB", {"field": "document"}
        )
    try:
        doc = parse_yaml(
            text, json_values=True
        )  # libyaml's events, without recursion (scheduling reads its files so)
    except ValueError as exc:
        raise InvalidRequest(f"document: {exc}", {"field": "document"}) from None
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"document: not valid YAML or JSON: {exc}"[:500], {"field": "document"}) from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("document: the top level must be a mapping", {"field": "document"})
    return doc


def order_and_cycle(actions: Mapping[str, Action]) -> tuple[list[str], list[str] | None]:
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
    actions: Mapping[str, Action], order: list[str], targets: list[str], askers: set[str] | None = None
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
        a.id: a.fields.get("model_name")
        for a in wf.actions
        if a.type == "inference" and not a.fields.get("service_url") and not a.fields.get("service")
    }
    if not serves or not askers:
        return {}
    masks: dict[Any, int] = {}
    for i, b in enumerate(serves):
        masks[b.fields.get("model_name")] = masks.get(b.fields.get("model_name"), 0) | 1 << i
    by_id = wf.by_id()
    out = {}
    for aid, bits in reach(by_id, order_and_cycle(by_id)[0], [b.id for b in serves], set(askers)):
        mine = bits & masks.get(askers[aid], 0)
        if mine:
            out[aid] = serves[(mine & -mine).bit_length() - 1].id
    return out


def _check_refs(errors: Errors, actions: dict[str, Action], order: list[str], refused: set[str]) -> None:
    """Every `${step.field}` names an action this one depends on and an output that action has. A reference to
    a direct dependency is settled at once; the others are looked up in one `reach` pass."""
    far: dict[str, list[tuple[str, str, str]]] = {}
    for a in actions.values():
        direct = set(a.deps)
        for path, step, fld in a.refs:
            if step in refused:
                continue  # refused for its own fields already
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
    custom = (b.fields.get("outputs") or {}) if b.type == "noop" else {}
    if fld != "output" and fld not in OUTPUTS[b.type] and fld not in custom:
        errors.add(path, f"`${{{b.id}.{fld}}}`: a {b.type} action has no output {fld!r}")


def _top(errors: Errors, doc: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return dict(_TOP.load(doc))
    except ma.ValidationError as exc:
        for path, message in flatten("", exc.messages):
            errors.add(path, message)
        return {}


def validate(doc: Mapping[str, Any], task_timeout_s: float = 3600) -> Workflow:
    """The document parsed into a typed Workflow; one InvalidRequest listing every problem."""
    errors = Errors()
    top = _top(errors, doc)
    raw_actions = doc.get("actions")
    if not isinstance(raw_actions, list) or not raw_actions:
        errors.add("actions", "required: a non-empty list")
        raw_actions = []
    if len(raw_actions) > MAX_ACTIONS:
        errors.add("actions", f"at most {MAX_ACTIONS:,} actions")
        errors.raise_if_any()
    actions: dict[str, Action] = {}
    refused: set[str] = set()  # actions refused for their own fields: named, but not checked as a graph
    shapes = Shapes()  # actions that differ only in id and dependencies are loaded once
    for i, raw in enumerate(raw_actions):
        aid, a = shapes.parse(errors, i, raw, task_timeout_s)
        if aid is not None and (aid in actions or aid in refused):
            errors.add(f"actions[{aid}].action_id", "duplicate action id")
        elif a is not None:
            actions[a.id] = a
        elif aid is not None:
            refused.add(aid)
    for a in actions.values():
        for d in a.deps:
            if d not in actions and d not in refused:
                errors.add(f"actions[{a.id}].dependencies", f"{d!r} is not an action of this workflow")
            if d == a.id:
                errors.add(f"actions[{a.id}].dependencies", "an action cannot depend on itself")
    order, cycle = order_and_cycle(actions)
    if cycle:
        errors.add(f"actions[{cycle[0]}].dependencies", f"dependency cycle: {' -> '.join(cycle)}")
    else:
        actions.update(
            node_hosts(errors, actions)
        )  # `http://node1:8080` where a serve starts one: a reference
        _check_refs(errors, actions, order, refused)
        check_url_fields(errors, actions)
    errors.raise_if_any()
    return Workflow(
        str(top["name"]),
        str(top.get("description") or ""),
        dict(top.get("queue_config") or {}),
        bool(top.get("fail_fast", False)),
        tuple(actions.values()),
    )
