"""Documents cannot exhaust a worker: aliases and deep nesting are refused before anything expands, any order of a
chain validates, the graph checks grow linearly (counted in bytes, not timed), and workflow URLs take one form."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
import yaml

from gswarm_tasks.errors import InvalidRequest
from gswarm_web.api.limits import json_depth_over
from gswarm_web.workflows import spec
from gswarm_web.workflows.compiler import segments
from gswarm_web.workflows.spec import load_document, order_and_cycle, reach, validate
from tests.harness.hostile import ALIAS_BOMB


def noop(aid: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": aid, "action_type": "noop", "dependencies": list(deps), **kw}


def chain(n: int, ref: str = "previous") -> list[dict[str, Any]]:
    acts = [noop("a0", outputs={"x": 1})]
    for i in range(1, n):
        target = "a0" if ref == "first" else f"a{i - 1}"
        acts.append(noop(f"a{i}", f"a{i - 1}", outputs={"x": f"${{{target}.x}}"}))
    return acts


def test_the_alias_bomb_is_refused_before_it_expands() -> None:
    assert 550 < len(ALIAS_BOMB) < 650  # 10^9 strings once expanded
    with pytest.raises(InvalidRequest, match=r"^document: anchors \(&l0\) are not allowed \(line 2\)"):
        load_document(ALIAS_BOMB)
    with pytest.raises(InvalidRequest, match=r"^document: aliases \(\*a\) are not allowed"):
        load_document("name: x\nactions: *a\n")
    with pytest.raises(InvalidRequest, match="merge keys"):
        load_document("name: x\nactions:\n  - <<: {action_id: a}\n")


def test_deep_nesting_stops_the_parse_at_the_bound() -> None:
    # libyaml takes 37 s to parse 100,000 levels and its composer crashes on them (a segfault): the parse stops at 65
    # (or where libyaml's own guard stops its scanner, which reads flow collections ahead: the same refusal).
    for text in (
        "[" * 100_000 + "]" * 100_000,
        "".join(" " * i + "a:\n" for i in range(200)),
        "[" * 65 + "]" * 65,
    ):
        with pytest.raises(
            InvalidRequest, match=r"^document: nested deeper than 64 levels \(line \d+\)$"
        ) as caught:
            load_document(text)
        assert caught.value.details == {"field": "document"}
    nested: Any = "leaf"
    for _ in range(60):
        nested = [nested]
    assert load_document(json.dumps({"name": "ok", "x": nested}))["x"] == nested


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1: x\n", "mapping keys must be strings"),
        ("name: x\n? [a]\n: b\n", "mapping keys must be strings"),
        ("name: !!binary aGk=\n", "tag:yaml.org,2002:binary is not allowed"),
        ("name: !!python/object:os.system {}\n", "is not allowed"),
        ("name: .nan\n", "not a finite number"),
        ("name: a\n---\nname: b\n", "one document only"),
        ("x" * (spec.MAX_DOCUMENT_BYTES + 1), "larger than 8 MiB"),
    ],
)
def test_only_json_shaped_documents_are_taken(text: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=f"^document: .*{why}"):
        load_document(text)


def test_scalars_read_as_the_safe_loader_reads_them_and_dates_stay_text() -> None:
    doc = load_document("name: w\nn: 3\nf: 1.5\nb: yes\nz: null\nd: 2024-01-02\nq: '007'\n")
    assert doc == {"name": "w", "n": 3, "f": 1.5, "b": True, "z": None, "d": "2024-01-02", "q": "007"}


def test_a_chain_listed_in_reverse_order_validates() -> None:
    acts = chain(1500)
    acts.reverse()  # the recursive walks this replaced stopped at Python's recursion limit
    wf = validate(load_document(yaml.safe_dump({"name": "reverse", "actions": acts})))
    (only,) = segments(wf)
    assert [a.id for a in only] == [f"a{i}" for i in range(1500)]


def test_references_to_far_ancestors_are_checked_in_one_pass() -> None:
    wf = validate({"name": "far", "actions": chain(300, ref="first")})
    assert wf.by_id()["a299"].refs == [("actions[a299].outputs.x", "a0", "x")]
    acts = [*chain(5), noop("side"), noop("z", "a4", outputs={"x": "${side.x}", "y": "${a0.nope}"})]
    with pytest.raises(InvalidRequest) as exc:
        validate({"name": "far", "actions": acts})
    assert [e["message"] for e in exc.value.details["errors"]] == [
        "`${side.x}`: z does not depend on side",
        "`${a0.nope}`: a noop action has no output 'nope'",
    ]


def test_order_cycle_and_reach_without_recursion() -> None:
    wf = validate({"name": "g", "actions": [noop("d", "b", "c"), noop("b", "a"), noop("c", "a"), noop("a")]})
    by_id = wf.by_id()
    order, cycle = order_and_cycle(by_id)
    assert cycle is None and order == ["a", "b", "c", "d"]
    bits = dict(reach(by_id, order, ["a", "b", "c"]))
    assert bits == {"a": 0, "b": 0b001, "c": 0b001, "d": 0b111}
    with pytest.raises(InvalidRequest, match=r"dependency cycle: a -> c -> b -> a"):
        validate({"name": "c", "actions": [noop("a", "c"), noop("b", "a"), noop("c", "b")]})


def _peak_bytes(n: int, ref: str) -> int:
    text = yaml.safe_dump({"name": "chain", "actions": chain(n, ref)})
    tracemalloc.start()
    try:
        segments(validate(load_document(text)))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("ref", ["previous", "first"])
def test_validation_memory_grows_linearly(ref: str) -> None:
    """Four times the actions take about four times the memory (the ancestor sets this replaced took sixteen);
    bytes are counted, not seconds (bench/documents.py times it)."""
    small, large = _peak_bytes(1000, ref), _peak_bytes(4000, ref)
    assert large / small < 5.5, (small, large)


@pytest.mark.parametrize(
    ("action", "field", "message"),
    [
        (
            {"action_type": "health_check", "target_url": "http://127.0.0.1:1\\@ok.example/"},
            "target_url",
            "backslash",
        ),
        (
            {"action_type": "health_check", "target_url": "http://u@ok.example/"},
            "target_url",
            "user information",
        ),
        (
            {"action_type": "health_check", "target_url": "${n.service_url}/health"},
            "target_url",
            "from a serve",
        ),
        (
            {"action_type": "health_check", "target_url": "${s.service_url}@evil/"},
            "target_url",
            "followed by a path",
        ),
        (
            {"action_type": "health_check", "target_url": "http://x/${s.service_url}"},
            "target_url",
            "followed by a",
        ),
        (
            {
                "action_type": "inference",
                "input": "c",
                "service": "gopher://x",
                "output_device": "node1:dram",
            },
            "service",
            "scheme",
        ),
        (
            {"action_type": "inference", "input": "c", "model_name": "m", "endpoint": "../admin"},
            "endpoint",
            "a path such as",
        ),
    ],
)
def test_workflow_urls_take_one_form(action: dict[str, Any], field: str, message: str) -> None:
    serve = {"action_id": "s", "action_type": "serve", "model_name": "m", "device": "node1:gpu0"}
    acts = [noop("n", outputs={"service_url": "http://169.254.169.254"}), serve]
    with pytest.raises(InvalidRequest) as exc:
        validate({"name": "u", "actions": [*acts, {"action_id": "x", "dependencies": ["n", "s"], **action}]})
    errors = {e["field"]: e["message"] for e in exc.value.details["errors"]}
    assert message in errors.get(f"actions[x].{field}", ""), errors


def test_a_serve_url_with_a_path_is_accepted() -> None:
    serve = {"action_id": "s", "action_type": "serve", "model_name": "m", "device": "node1:gpu0"}
    check = {"action_id": "h", "action_type": "health_check", "target_url": "${s.service_url}/health"}
    wf = validate({"name": "ok", "actions": [serve, {**check, "dependencies": ["s"]}]})
    assert wf.by_id()["h"].refs == [("actions[h].target_url", "s", "service_url")]


def test_json_depth_is_measured_without_parsing() -> None:
    assert not json_depth_over(b"[" * 64 + b"]" * 64)
    assert json_depth_over(b"[" * 65 + b"]" * 65)
    assert json_depth_over(b"[" * 10_000)  # unclosed levels count too
    assert not json_depth_over(
        json.dumps({"s": "[" * 100 + '\\"' + "{" * 100}).encode()
    )  # brackets in strings
    assert json_depth_over(b'{"a": "\\\\", "b": ' + b"[" * 70 + b"]" * 70 + b"}")  # an escaped backslash ends
    assert not json_depth_over(json.dumps([{"a": [1, {"b": [2]}]}] * 10_000).encode())
