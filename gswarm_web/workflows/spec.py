"""The workflow document: parse YAML or JSON, validate every action and the graph before anything runs, and
normalize it. One InvalidRequest lists every problem, each naming its action and field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from gswarm_tasks.errors import InvalidRequest

from .actions import OUTPUTS, Action, Errors, check_int, parse_action

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
TOP = {"name", "description", "queue_config", "actions", "fail_fast", "version"}
QUEUE_CONFIG = {"max_concurrent_tasks", "enable_resource_tracking", "resource_tracking", "priority_levels"}


@dataclass
class Workflow:
    name: str
    description: str
    queue_config: dict[str, Any]
    fail_fast: bool
    actions: list[Action]

    def by_id(self) -> dict[str, Action]:
        return {a.id: a for a in self.actions}


def load_document(text: str | bytes) -> dict[str, Any]:
    """YAML or JSON (JSON is YAML) into a mapping; anything else is INVALID_REQUEST."""
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506  (a safe loader, libyaml's when present)
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"document: not valid YAML or JSON: {exc}"[:500], {"field": "document"}) from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("document: the top level must be a mapping", {"field": "document"})
    return doc


def ancestors(actions: dict[str, Action]) -> dict[str, set[str]]:
    memo: dict[str, set[str]] = {}

    def walk(aid: str, stack: tuple[str, ...]) -> set[str]:
        if aid in memo:
            return memo[aid]
        out: set[str] = set()
        for d in actions[aid].deps:
            if d in actions and d not in stack:
                out |= {d} | walk(d, (*stack, d))
        memo[aid] = out
        return out

    return {aid: walk(aid, (aid,)) for aid in actions}


def find_cycle(actions: dict[str, Action]) -> list[str] | None:
    color: dict[str, int] = {}
    path: list[str] = []

    def visit(a: str) -> list[str] | None:
        color[a] = 1
        path.append(a)
        for d in actions[a].deps:
            if d not in actions:
                continue
            if color.get(d) == 1:
                return path[path.index(d) :] + [d]
            if color.get(d) is None and (cyc := visit(d)):
                return cyc
        color[a] = 2
        path.pop()
        return None

    for a in actions:
        if color.get(a) is None and (cyc := visit(a)):
            return cyc
    return None


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
    raw_actions = doc.get("actions")
    if not isinstance(raw_actions, list) or not raw_actions:
        errors.add("actions", "required: a non-empty list")
        raw_actions = []
    if len(raw_actions) > 10_000:
        errors.add("actions", "at most 10,000 actions")
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
    cycle = find_cycle(actions)
    if cycle:
        errors.add(f"actions[{cycle[0]}].dependencies", f"dependency cycle: {' -> '.join(cycle)}")
    if not cycle:
        anc = ancestors(actions)
        for a in actions.values():
            for path, step, fld in a.refs:
                if step not in actions:
                    errors.add(path, f"`${{{step}.{fld}}}` names no action of this workflow")
                elif step not in anc[a.id]:
                    errors.add(path, f"`${{{step}.{fld}}}`: {a.id} does not depend on {step}")
                elif (
                    fld != "output"
                    and fld not in OUTPUTS[actions[step].type]
                    and not (actions[step].type == "noop" and fld in (actions[step].params.get("outputs") or {}))
                ):
                    errors.add(path, f"`${{{step}.{fld}}}`: a {actions[step].type} action has no output {fld!r}")
    errors.raise_if_any()
    return Workflow(
        str(name),
        str(doc.get("description") or ""),
        dict(qc),
        bool(doc.get("fail_fast", False)),
        list(actions.values()),
    )
