"""Actions of one shape (the same fields besides id and dependencies) are loaded once: every action, accepted or
refused, gets exactly what its type's schema gives it alone."""

from __future__ import annotations

from typing import Any

from gswarm_web.workflows.actions import Errors
from gswarm_web.workflows.schemas import parse_action
from gswarm_web.workflows.shapes import Shapes
from gswarm_web.workflows.spec import validate


def noop(aid: Any, deps: Any = None, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"action_id": aid, "action_type": "noop", "node": "node1", **kw}
    if deps is not None:
        out["dependencies"] = deps
    return out


ACTIONS = [
    noop("a"),
    noop("b", ["a"]),
    noop("c", ["a", "b"]),
    noop("d", ["a", "a"]),  # listed twice: refused
    noop("e", "a"),  # not a list: refused
    noop("bad id!", ["a"]),  # refused
    noop("f", [1]),  # refused
    noop("g", None, duration_s=1),
    noop("h", None, duration_s=1.0),  # another shape: 1 and 1.0 are not the same text
    noop("i", None, duration_s=True),  # refused (a boolean is not a number), however often
    noop("j", None, duration_s=True),
    noop("k", ["g"], description="x ${a.y}"),  # a reference: never kept
    noop("l", ["g"], description="x ${a.y}"),
    {"action_id": "m", "action_type": "noop", "node": "node1", "dependencies": None},
    {"action_id": "n", "action_type": "noop", "node": "Node_1"},  # refused, and again
    {"action_id": "o", "action_type": "noop", "node": "Node_1"},
    {"action_id": "p", "action_type": "nope", "node": "node1"},
]


def test_each_action_is_what_its_schema_makes_of_it() -> None:
    shapes, together = Shapes(), Errors()
    for i, raw in enumerate(ACTIONS):
        alone = Errors()
        want = parse_action(alone, i, raw, 3600)
        before = len(together.items)
        got = shapes.parse(together, i, raw, 3600)
        assert got == want, raw
        assert together.items[before:] == alone.items, raw
    assert len(shapes.seen) == 3  # the shapes of a (m too: null dependencies are none), g and h
    refused = {e["field"] for e in together.items}
    assert {"actions[d].dependencies", "actions[e].dependencies", "actions[5].action_id", "actions[f].dependencies",
            "actions[i].duration_s", "actions[j].duration_s", "actions[n].node", "actions[o].node",
            "actions[p].action_type"} <= refused  # fmt: skip


def test_a_generated_workflow_validates_as_before() -> None:
    actions = [noop(f"s{i}", [f"s{i - 1}"] if i % 10 else []) for i in range(2000)]
    wf = validate({"name": "big", "actions": actions})
    assert [a.id for a in wf.actions] == [f"s{i}" for i in range(2000)]
    assert wf.actions[11].deps == ("s10",) and wf.actions[10].deps == ()
    assert all(a.node == "node1" and a.type == "noop" for a in wf.actions)
    assert len({id(a.fields) for a in wf.actions}) == 1  # loaded once, shared (frozen, plain values)
