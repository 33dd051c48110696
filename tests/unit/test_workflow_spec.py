"""The workflow document: the original examples validate; every kind of mistake is refused with its field."""

from __future__ import annotations

import pytest

from gswarm_tasks.errors import InvalidRequest
from gswarm_web.workflows.actions import AUTO_DEFAULTS, is_auto
from gswarm_web.workflows.compiler import segments
from gswarm_web.workflows.examples import EXAMPLES, RUNNABLE
from gswarm_web.workflows.spec import load_document, validate


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_original_examples_validate_as_written(name: str) -> None:
    wf = validate(load_document(EXAMPLES[name]))
    assert wf.actions


def test_both_device_forms_normalize_alike() -> None:
    simple = validate(load_document(EXAMPLES["simple-deployment"])).by_id()
    assert simple["move_to_gpu"].params["source_device"] == "node1:disk"
    assert simple["move_to_gpu"].params["target_device"] == "node1:gpu0"
    assert simple["move_to_gpu"].exclusive == ["node1:gpu0"]
    dist = validate(load_document(EXAMPLES["distributed-deployment"])).by_id()
    assert dist["replicate_node2"].params["target_device"] == "node2:disk"
    stage = validate(load_document(EXAMPLES["multi-stage-pipeline"]))
    assert stage.queue_config["max_concurrent_tasks"] == 4
    assert stage.by_id()["download_llm"].priority == "high"


def doc(*actions: dict, **top: object) -> dict:
    return {"name": "t", "actions": list(actions), **top}


def noop(aid: str, *deps: str, **kw: object) -> dict:
    return {"action_id": aid, "action_type": "noop", "dependencies": list(deps), **kw}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        (doc(noop("a", "b"), noop("b", "a")), "actions[a].dependencies"),
        (doc(noop("a", "ghost")), "actions[a].dependencies"),
        (doc(noop("a"), noop("a")), "actions[a].action_id"),
        (doc({"action_id": "a", "action_type": "teleport"}), "actions[a].action_type"),
        (doc(noop("a", colour="red")), "actions[a].colour"),
        (
            doc(
                {
                    "action_id": "d",
                    "action_type": "download",
                    "model_name": "m",
                    "target_device": "node1:tape",
                }
            ),
            "actions[d].target_device",
        ),
        (
            doc(
                {
                    "action_id": "d",
                    "action_type": "move",
                    "model_name": "m",
                    "devices": ["node1:disk", "Node_1:gpu0"],
                }
            ),
            "actions[d].target_device",
        ),
        (
            doc(
                {
                    "action_id": "d",
                    "action_type": "download",
                    "model_name": "../x",
                    "target_device": "node1:disk",
                }
            ),
            "actions[d].model_name",
        ),
        (doc(noop("a"), noop("b", outputs={"x": "${a.missing}"})), "actions[b].outputs.x"),
        (
            doc(noop("a"), noop("b", outputs={"x": "${a.output}"})),
            "actions[b].outputs.x",
        ),  # b does not depend on a
        (doc(noop("a"), noop("b", "a", outputs={"x": "${ghost.output}"})), "actions[b].outputs.x"),
        (doc(noop("a", retries=-1)), "actions[a].retries"),
        (doc(noop("a", priority="urgent")), "actions[a].priority"),
        (doc(noop("a"), queue_config={"max_concurrent_tasks": 0}), "queue_config.max_concurrent_tasks"),
        (doc(noop("a"), colour="red"), "colour"),
        ({"actions": [noop("a")]}, "name"),
        ({"name": "t", "actions": []}, "actions"),
        (
            doc({"action_id": "s", "action_type": "serve", "model_name": "m", "device": "auto:tape"}),
            "actions[s].device",
        ),
        (
            doc({"action_id": "h", "action_type": "health_check", "target_url": "ftp://x"}),
            "actions[h].target_url",
        ),
    ],
)
def test_mistakes_are_refused_naming_action_and_field(document: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        validate(document)
    fields = [e["field"] for e in exc.value.details["errors"]]
    assert any(f.startswith(field) for f in fields), fields
    assert exc.value.message.startswith(fields[0])


def test_reference_to_an_ancestor_is_accepted() -> None:
    wf = validate(doc(noop("a", outputs={"x": 1}), noop("b", "a"), noop("c", "b", outputs={"y": "${a.x}"})))
    assert wf.by_id()["c"].refs == [("actions[c].outputs.y", "a", "x")]


def test_bad_yaml_is_invalid_request() -> None:
    with pytest.raises(InvalidRequest):
        load_document("name: [unclosed")
    with pytest.raises(InvalidRequest):
        load_document("- just\n- a list\n")


def test_segments_never_add_a_barrier() -> None:
    # a -> c, a -> d, b -> d (not series-parallel): c must not wait for b.
    wf = validate(
        doc(noop("a"), noop("b"), noop("c", "a"), noop("d", "a", "b"), noop("e", "c"), noop("f", "e"))
    )
    segs = [[a.id for a in s] for s in segments(wf)]
    assert sorted(segs) == [["a"], ["b"], ["c", "e", "f"], ["d"]]
    chain = validate(doc(*[noop(f"s{i}", *([f"s{i - 1}"] if i else [])) for i in range(5)]))
    assert [[a.id for a in s] for s in segments(chain)] == [["s0", "s1", "s2", "s3", "s4"]]


def test_data_actions_normalize_their_devices() -> None:
    wf = validate(
        doc(
            {"action_id": "a", "action_type": "data_create", "data": "aGk=", "target_device": "node1:dram"},
            {
                "action_id": "t",
                "action_type": "data_transfer",
                "data_id": "${a.chunk_id}",
                "target_node": "node2",
                "target_device": "disk",
                "dependencies": ["a"],
            },
            {
                "action_id": "u",
                "action_type": "data_transfer",
                "data_id": "${a.output}",
                "target_node": "node3",
                "dependencies": ["a"],
            },
        )
    ).by_id()
    assert wf["t"].params["target_device"] == "node2:disk"
    assert wf["u"].params["target_device"] == "node3:dram"


@pytest.mark.parametrize(
    ("action", "field"),
    [
        (
            {"action_type": "data_move", "data_id": "c", "target_device": "node1:gpu0"},
            "actions[x].target_device",
        ),
        (
            {
                "action_type": "data_transfer",
                "data_id": "c",
                "target_node": "node2",
                "target_device": "node1:dram",
            },
            "actions[x].target_device",
        ),
        ({"action_type": "inference", "input": "c", "output_device": "node1:dram"}, "actions[x].service_url"),
        ({"action_type": "data_merge", "inputs": [], "output_device": "node1:dram"}, "actions[x].inputs"),
        (
            {"action_type": "data_merge", "inputs": ["c"], "output_device": "node1:dram", "format": "zip"},
            "actions[x].format",
        ),
        (
            {
                "action_type": "data_create",
                "source": "file:///x",
                "target_device": "node1:dram",
                "data_type": "tmp",
            },
            "actions[x].data_type",
        ),
    ],
)
def test_data_action_mistakes_name_the_field(action: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        validate(doc({"action_id": "x", **action}))
    assert exc.value.message.startswith(field), exc.value.message


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_runnable_examples_name_no_node(name: str) -> None:
    """`gswarm workflow example` writes these: the original's actions, every device left to placement."""
    wf = validate(load_document(RUNNABLE[name]))
    original = validate(load_document(EXAMPLES[name]))
    assert [a.type for a in wf.actions] == [a.type for a in original.actions]
    assert "node1" not in RUNNABLE[name] and "node2" not in RUNNABLE[name]
    for a in wf.actions:
        for key in AUTO_DEFAULTS.get(a.type, ()):
            value = a.params.get(key)
            assert is_auto(value) or "${" in str(value), (a.id, key, value)


def test_the_originals_queue_switches_are_on_or_refused_saying_so() -> None:
    base = {"name": "q", "actions": [noop("a")]}
    ok = {"max_concurrent_tasks": 4, "enable_resource_tracking": True, "resource_tracking": True,
          "priority_levels": ["critical", "high", "normal", "low"]}  # fmt: skip
    assert validate({**base, "queue_config": ok}).queue_config == ok
    for key, value, says in (
        ("enable_resource_tracking", False, "always on"),
        ("priority_levels", ["urgent", "normal"], "the levels are fixed"),
    ):
        with pytest.raises(InvalidRequest, match=rf"^queue_config.{key}: {says}"):
            validate({**base, "queue_config": {key: value}})
