"""A workflow document is parsed once, at the edge, into typed values: one schema per action type refuses what that
type does not have, device fields are `Device` / `Auto` / `Ref`, and nothing after the edge parses a device string
again (submission's checks included)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import pytest
from flask import Flask

from gswarm_tasks.devices import Auto, Device
from gswarm_tasks.errors import InvalidRequest
from gswarm_web.workflows.actions import FIELDS
from gswarm_web.workflows.compiler import step_queue
from gswarm_web.workflows.document import Ref
from gswarm_web.workflows.spec import validate


@pytest.mark.parametrize("atype", sorted(FIELDS))
def test_an_unknown_field_is_refused_naming_the_action_and_field(atype: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        validate({"name": "t", "actions": [{"action_id": "x", "action_type": atype, "colour": "red"}]})
    errors = {e["field"]: e["message"] for e in exc.value.details["errors"]}
    assert errors["actions[x].colour"] == f"unknown field for a {atype} action", errors


def test_a_field_of_another_action_type_is_unknown_to_this_one() -> None:
    serve_only = {"action_id": "d", "action_type": "download", "model_name": "m", "port": 8080}
    with pytest.raises(InvalidRequest) as exc:
        validate({"name": "t", "actions": [serve_only]})
    assert exc.value.message == "actions[d].port: unknown field for a download action"


def test_device_fields_are_typed_values() -> None:
    wf = validate(
        {
            "name": "t",
            "actions": [
                {"action_id": "d", "action_type": "download", "model_name": "m", "devices": ["node1:disk"]},
                {
                    "action_id": "m",
                    "action_type": "move",
                    "model_name": "m",
                    "devices": ["node1:disk", "gpu0"],
                    "node": "node1",
                    "dependencies": ["d"],
                },  # fmt: skip
                {"action_id": "s", "action_type": "serve", "model_name": "m", "dependencies": ["m"]},
                {
                    "action_id": "c",
                    "action_type": "data_create",
                    "data": "aGk=",
                    "target_device": "node2:dram",
                },
                {
                    "action_id": "t",
                    "action_type": "data_move",
                    "data_id": "${c.output.chunk_id}",
                    "target_device": "${c.device}",
                    "dependencies": ["c"],
                },  # fmt: skip
            ],
        }
    ).by_id()
    assert wf["d"].device("target_device") == Device("node1", "disk")
    assert wf["m"].device("target_device") == Device("node1", "gpu0")  # a bare tier is on the action's node
    assert wf["m"].holds == (Device("node1", "gpu0"),) and wf["m"].exclusive == ["node1:gpu0"]
    assert wf["s"].device("device") == Auto()  # left out: placement chooses it
    assert wf["t"].fields["data_id"] == Ref("c", "chunk_id", "c.output.chunk_id")
    assert wf["t"].device("target_device") == Ref("c", "device", "c.device")
    assert wf["t"].params["data_id"] == "${c.output.chunk_id}"  # the node resolves it as written
    assert step_queue(wf["m"]) == "node1" and step_queue(wf["c"]) == "node2"


@pytest.mark.parametrize(
    ("action", "field", "says"),
    [
        (
            {"action_type": "delete", "model_name": "m", "device": "auto"},
            "device",
            "placement does not choose",
        ),
        (
            {"action_type": "data_move", "data_id": "x-${c.chunk_id}", "target_device": "n:dram"},
            "data_id",
            "one ref",
        ),
        (
            {"action_type": "data_move", "data_id": "c", "target_device": "${c}"},
            "target_device",
            "not a reference",
        ),
        ({"action_type": "noop", "exclusive": ["n:gpu0", "auto"]}, "exclusive[1]", "name one"),
        ({"action_type": "noop", "exclusive": ["n:gpu0", 7]}, "exclusive[1]", "a device name is required"),
        ({"action_type": "noop", "timeout_s": 7200}, "timeout_s", "a number from 1 to 3600"),
    ],
)
def test_typed_fields_refuse_what_they_cannot_hold(action: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        validate({"name": "t", "actions": [{"action_id": "x", **action}]})
    errors = {e["field"]: e["message"] for e in exc.value.details["errors"]}
    assert says in errors.get(f"actions[x].{field}", ""), errors


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Device.parse calls by the module that made them."""
    calls: Counter[str] = Counter()
    parse = Device.parse.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Device], *args: Any, **kw: Any) -> Device:
        calls[sys._getframe(1).f_globals["__name__"]] += 1
        return parse(cls, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(Device, "parse", classmethod(counted))
    return calls


def test_a_device_string_is_parsed_once_through_submission(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime

    from gswarm_web.extensions import db
    from gswarm_web.tables import Node
    from gswarm_web.workflows.submit import check

    for name in ("node1", "node2"):
        db.session.add(Node(name=name, last_seen=datetime.now(UTC)))
    db.session.commit()
    doc = {
        "name": "once",
        "actions": [
            {
                "action_id": "get",
                "action_type": "download",
                "model_name": "m",
                "source_url": "hf://org/m",
                "target_device": "node1:disk",
            },  # fmt: skip
            {
                "action_id": "load",
                "action_type": "move",
                "model_name": "m",
                "devices": ["node1:disk", "node1:gpu0"],
                "dependencies": ["get"],
            },  # fmt: skip
            {
                "action_id": "serve",
                "action_type": "serve",
                "model_name": "m",
                "device": "node1:gpu0",
                "dependencies": ["load"],
            },  # fmt: skip
        ],
    }
    calls = _counting(monkeypatch)
    answer = check(doc)
    assert answer["valid"] and [s["node"] for s in answer["steps"]] == ["node1", "node1", "node1"]
    workflows = {m: n for m, n in calls.items() if m.startswith("gswarm_web.workflows")}
    assert workflows == {"gswarm_web.workflows.schemas": 4}, calls  # the four device strings, each once


def test_params_are_the_json_a_node_receives() -> None:
    merge = {"action_id": "m", "action_type": "data_merge", "inputs": ["${a.chunk_id}", "c0"],
             "output_device": "node1:dram", "dependencies": ["a"]}  # fmt: skip
    make = {"action_id": "a", "action_type": "data_create", "data": "aGk=", "target_device": "node1:disk"}
    wf = validate({"name": "j", "actions": [make, merge]}).by_id()
    assert wf["m"].fields["inputs"] == [Ref("a", "chunk_id", "a.chunk_id"), "c0"]
    assert json.loads(json.dumps(wf["m"].params)) == {
        "inputs": ["${a.chunk_id}", "c0"],
        "output_device": "node1:dram",
    }
