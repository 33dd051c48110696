"""The validator accepts a schedule worked out by hand and rejects each way of corrupting it.

The hand schedule (tiny_config.json, hand_requests.yaml, 2 GPUs, no fleet so loads take the config's seconds):
r1 arrives at 0: `a` (llm) loads 10 s on GPU 0 and runs 10-14; `b` (img) loads 5 s on GPU 1 and runs 19-21.
r2 arrives at 1: `x` (big, 2 GPUs) waits for GPU 1, loads 20 s on both and runs 41-47; `y` (llm) reloads on GPU 0
and runs 57-60. Loads: 1 + 1 + 2 + 1 = 5 (65 GPU-seconds); latencies 21 and 59, so p50 40 and p99 58.62.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gswarm_web.scheduling import load_config, validate
from gswarm_web.scheduling.api import prepare, validate_payload

DATA = Path(__file__).parent / "scheduling_data"


def hand() -> dict[str, Any]:
    return json.loads((DATA / "hand_schedule.json").read_text())


def checks(doc: dict[str, Any], mode: str = "online") -> set[str]:
    config = load_config(DATA / "tiny_config.json")
    workload, fleet = prepare(
        config, yaml.safe_load((DATA / "hand_requests.yaml").read_text()), 2, None, mode
    )
    return {v.check for v in validate(doc, workload, fleet, mode)}


def step(doc: dict[str, Any], rid: str, nid: str) -> dict[str, Any]:
    return next(e for e in doc["executions"] if e["request_id"] == rid and e["node_id"] == nid)


def test_the_hand_checked_schedule_is_valid() -> None:
    assert checks(hand()) == set()


def broken_dependency(doc: dict[str, Any]) -> None:
    b = step(doc, "r1", "b")
    b.update(start_time=13.0, end_time=15.0)  # starts before `a` ends at 14
    doc["summary"].update(request_latency_p50=37.0, request_latency_p99=58.56)


def overlap_on_second_gpu(doc: dict[str, Any]) -> None:
    # `x` begins loading at 15 on GPUs 0 and 1: free on GPU 0 (a ended at 14), but GPU 1 runs `b` until 21
    step(doc, "r2", "x").update(start_time=35.0, end_time=41.0)
    step(doc, "r2", "y").update(start_time=51.0, end_time=54.0)
    doc["summary"].update(makespan=54.0, request_latency_p50=37.0, request_latency_p99=52.68)


def missing_step(doc: dict[str, Any]) -> None:
    doc["executions"] = [e for e in doc["executions"] if e["node_id"] != "y"]
    doc["summary"].update(makespan=47.0, model_loads=4, load_seconds=55.0, steps=3)
    doc["summary"].update(request_latency_p50=33.5, request_latency_p99=45.75)


def free_switch(doc: dict[str, Any]) -> None:
    # GPU 0 last held `big`, yet `y` claims the llm was still resident there
    step(doc, "r2", "y").update(start_time=47.0, end_time=50.0, switch_time=0.0, loaded_from="gpu")
    doc["summary"].update(makespan=50.0, model_loads=4, load_seconds=55.0)
    doc["summary"].update(request_latency_p50=35.0, request_latency_p99=48.72)


def cheap_switch(doc: dict[str, Any]) -> None:
    step(doc, "r2", "y").update(start_time=49.0, end_time=52.0, switch_time=2.0)  # a 10 s load paid as 2 s
    doc["summary"].update(
        makespan=52.0, load_seconds=57.0, request_latency_p50=36.0, request_latency_p99=50.7
    )


def load_counted_wrongly(doc: dict[str, Any]) -> None:
    doc["summary"]["model_loads"] = (
        4  # the 2-GPU load counted once, as the original counted its first GPU only
    )


def one_gpu_for_a_two_gpu_model(doc: dict[str, Any]) -> None:
    step(doc, "r2", "x").update(gpus=[0])


def ran_twice(doc: dict[str, Any]) -> None:
    doc["executions"].append(dict(step(doc, "r1", "a"), gpus=[1], gpu_id=1, start_time=70.0, end_time=74.0))


def shortened(doc: dict[str, Any]) -> None:
    step(doc, "r1", "b").update(end_time=20.0)
    doc["summary"].update(request_latency_p50=39.5, request_latency_p99=58.61)


def before_arrival(doc: dict[str, Any]) -> None:
    # r2 arrives at 1; `x` made to begin its load at 0.5 on GPU 1 (and `b` moved out of its way)
    step(doc, "r1", "b").update(
        gpus=[0], gpu_id=0, start_time=14.0, end_time=16.0, switch_time=0.0, loaded_from="gpu"
    )
    step(doc, "r2", "x").update(start_time=20.5, end_time=26.5)


CORRUPTIONS: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (broken_dependency, "dependency"),
    (overlap_on_second_gpu, "overlap"),
    (missing_step, "exactly once"),
    (free_switch, "free switch"),
    (cheap_switch, "free switch"),
    (load_counted_wrongly, "summary"),
    (one_gpu_for_a_two_gpu_model, "gpus"),
    (ran_twice, "exactly once"),
    (shortened, "duration"),
    (before_arrival, "arrival"),
]


@pytest.mark.parametrize(("corrupt", "check"), CORRUPTIONS, ids=[c.__name__ for c, _ in CORRUPTIONS])
def test_each_corruption_is_rejected_by_its_check(
    corrupt: Callable[[dict[str, Any]], None], check: str
) -> None:
    doc = hand()
    corrupt(doc)
    assert check in checks(doc)


def test_the_narrow_corruptions_break_only_their_rule() -> None:
    # so the tests above pass for the right reason, not because something else also broke
    for corrupt, check in CORRUPTIONS[:6]:
        doc = hand()
        corrupt(doc)
        assert checks(doc) == {check}, corrupt.__name__


def test_the_overlap_found_is_on_the_second_gpu_of_the_two_gpu_step() -> None:
    doc = hand()
    overlap_on_second_gpu(doc)
    config = load_config(DATA / "tiny_config.json")
    workload, fleet = prepare(
        config, yaml.safe_load((DATA / "hand_requests.yaml").read_text()), 2, None, "online"
    )
    found = [v for v in validate(doc, workload, fleet) if v.check == "overlap"]
    assert len(found) == 1 and found[0].message.startswith("GPU 1 ")


def test_malformed_documents_become_violations_not_crashes() -> None:
    assert "format" in checks({"summary": {}})
    doc = hand()
    doc["executions"][0]["start_time"] = "ten"
    doc["executions"][1]["loaded_from"] = "tape"
    assert {"format", "exactly once"} <= checks(doc)


def test_offline_mode_ignores_arrivals_and_recomputes_latency_from_zero() -> None:
    doc = copy.deepcopy(hand())
    doc["summary"].update(mode="offline", request_latency_p50=40.5, request_latency_p99=59.61)
    assert checks(doc, "offline") == set()


def test_validate_payload_answers_valid_and_the_violations() -> None:
    body = {
        "config": json.loads((DATA / "tiny_config.json").read_text()),
        "requests": yaml.safe_load((DATA / "hand_requests.yaml").read_text()),
        "gpus": 2,
        "schedule": hand(),
    }
    assert validate_payload(body) == {"valid": True, "violations": []}
    load_counted_wrongly(body["schedule"])
    answer = validate_payload(body)
    assert answer["valid"] is False
    assert answer["violations"][0]["check"] == "summary"
