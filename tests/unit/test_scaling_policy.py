"""The autoscaler's policy as pure functions: what a policy accepts, and the count each target asks for."""

from __future__ import annotations

import pytest

from gswarm_tasks.errors import InvalidRequest
from gswarm_web.control.serving.policy import Sample, decide, parse, wanted


def policy(**doc: float) -> object:
    return parse({"min_replicas": 1, "max_replicas": 4, **doc}, 2.0, 30.0)


def test_one_target_at_most_and_the_second_is_named() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse({"target_in_flight": 2, "target_engine_waiting": 1}, 2.0, 30.0)
    assert err.value.details == {"field": "autoscaling.target_engine_waiting"}
    with pytest.raises(InvalidRequest) as err:
        parse({"target_engine_waiting": 0}, 2.0, 30.0)
    assert err.value.details == {"field": "autoscaling.target_engine_waiting"}
    with pytest.raises(InvalidRequest) as err:
        parse({"target_engine_queue": 1}, 2.0, 30.0)
    assert err.value.details == {"field": "autoscaling.target_engine_queue"}


def test_a_policy_without_a_target_scales_on_requests_in_flight() -> None:
    assert parse({}, 2.0, 30.0).doc() == {
        "min_replicas": 1,
        "max_replicas": 1,
        "target_in_flight": 4.0,
        "scale_up_delay_s": 2.0,
        "scale_down_delay_s": 30.0,
    }
    doc = parse({"target_engine_waiting": 2}, 2.0, 30.0).doc()
    assert doc["target_engine_waiting"] == 2.0 and "target_in_flight" not in doc


def test_the_engines_queue_asks_for_enough_replicas_to_bring_it_to_the_target() -> None:
    p = policy(target_engine_waiting=2)
    assert wanted(p, 1, Sample(0, in_flight=8, waiting=0, engine_waiting=6)) == 3  # 6 waiting / 2 a replica
    assert wanted(p, 2, Sample(0, in_flight=8, waiting=0, engine_waiting=5)) == 3  # above: one more at least
    assert wanted(p, 2, Sample(0, in_flight=8, waiting=0, engine_waiting=40)) == 4  # within max_replicas
    assert (
        wanted(p, 2, Sample(0, in_flight=8, waiting=0, engine_waiting=3)) == 2
    )  # some wait, under target: stay
    assert wanted(p, 3, Sample(0, in_flight=8, waiting=0, engine_waiting=0)) == 2  # none waits: one fewer
    assert wanted(p, 1, Sample(0, in_flight=0, waiting=0, engine_waiting=0)) == 1  # within min_replicas


def test_without_an_engine_queue_the_gateways_queue_stands_in() -> None:
    p = policy(target_engine_waiting=1)
    assert wanted(p, 1, Sample(0, in_flight=4, waiting=3, engine_waiting=None)) == 3
    assert wanted(p, 2, Sample(0, in_flight=4, waiting=1, engine_waiting=None)) == 2
    assert wanted(p, 2, Sample(0, in_flight=4, waiting=0, engine_waiting=None)) == 1


def test_a_decision_on_the_engines_queue_waits_out_its_delay_and_says_why() -> None:
    p = policy(target_engine_waiting=2)
    busy = [Sample(t, in_flight=10, waiting=0, engine_waiting=8) for t in (0.0, 1.0, 2.0)]
    assert decide(p, 1, busy[:2], now=1.0) is None  # 1 s of history, the delay is 2 s
    want, why = decide(p, 1, busy, now=2.0)  # type: ignore[misc]
    assert want == 4 and "8.0 waiting in the engines' queues, target 2 per replica" in why
    quiet = [Sample(t, in_flight=2, waiting=0, engine_waiting=0) for t in range(0, 31)]
    assert decide(p, 3, quiet, now=30.0) == (2, decide(p, 3, quiet, now=30.0)[1])  # type: ignore[index]
    one_waits = quiet[:-1] + [Sample(30, in_flight=2, waiting=0, engine_waiting=1)]
    assert decide(p, 3, one_waits, now=30.0) is None  # a request waited in the window: no scale-down
