"""Actions that differ only in their id and dependencies, parsed once: a generated workflow of 10,000 steps is mostly
a few shapes of action (`{action_type: noop, node: node1}`), and loading each through its type's schema is most of
the time its validation takes.

An action whose other fields are plain values (text, numbers, booleans, null: no mapping, list or `${...}`) and that
was accepted is kept by those fields, as written; the next action with the very same fields is the kept one with its
own id and dependencies, checked as the schema checks them. Anything else, and any action that is refused, goes
through `schemas.parse_action`, so every answer and every refusal is the schema's."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .actions import ACTION_ID_RE, Errors
from .document import Action
from .schemas import parse_action

_OWN = ("action_id", "dependencies")


def _shape(raw: dict[str, Any]) -> str | None:
    """The action's fields besides its id and dependencies as one text (their order kept), or None when they hold
    anything but plain values."""
    rest = {k: v for k, v in raw.items() if k not in _OWN}
    if any(v is not None and not isinstance(v, str | int | float) for v in rest.values()):
        return None
    key = json.dumps(rest)  # 1, 1.0 and true stay apart
    return None if "${" in key else key


def _dependencies(value: Any) -> tuple[str, ...] | None:
    """The dependencies as the schema loads them (null: none), or None where the schema would refuse them."""
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(d, str) for d in value) and len(set(value)) == len(value):
        return tuple(value)
    return None


class Shapes:
    """The actions of one document accepted so far, by shape."""

    def __init__(self) -> None:
        self.seen: dict[str, Action] = {}

    def parse(
        self, errors: Errors, i: int, raw: Any, task_timeout_s: float
    ) -> tuple[str | None, Action | None]:
        """`schemas.parse_action`'s answer, from a kept action of the same shape where there is one."""
        key = _shape(raw) if isinstance(raw, dict) else None
        if key is not None and key in self.seen:
            aid = raw.get("action_id")
            deps = _dependencies(raw.get("dependencies"))
            if isinstance(aid, str) and ACTION_ID_RE.match(aid) and deps is not None:
                return aid, dataclasses.replace(self.seen[key], id=aid, deps=deps)
        aid, action = parse_action(errors, i, raw, task_timeout_s)
        if key is not None and action is not None and not action.ref_sites:
            self.seen[key] = action
        return aid, action
