"""The gateway's pick rule (control/serving/pick.py:choose), case by case; its Lua twin is held to the same picks in
tests/integration/test_gateway_pick_twin.py."""

from __future__ import annotations

import pytest

from gswarm_web.control.serving.pick import choose

ABC = ["a", "b", "c"]


def test_round_robin_takes_the_replica_whose_turn_it_is_whatever_it_has_in_flight() -> None:
    counts = {"a": 9, "b": 0, "c": 4}
    assert [choose(ABC, counts, "round_robin", turn) for turn in range(5)] == ["a", "b", "c", "a", "b"]


def test_least_requests_takes_the_fewest_in_flight_and_a_tie_in_turn() -> None:
    assert choose(ABC, {"a": 2, "b": 1, "c": 3}, "least_requests", 0) == "b"
    tie = {"a": 1, "b": 1, "c": 1}
    assert [choose(ABC, tie, "least_requests", turn) for turn in range(4)] == ["a", "b", "c", "a"]
    assert choose(ABC, {"a": 1, "b": 0, "c": 0}, "least_requests", 0) == "b"  # of b and c, the first from a
    assert choose(ABC, {"a": 1, "b": 0, "c": 0}, "least_requests", 2) == "c"  # of c and b, the first from c
    assert choose(ABC, {}, "least_requests", 1) == "b"  # none counted: none in flight


@pytest.mark.parametrize("policy", ["least_requests", "round_robin"])
def test_draining_and_capped_replicas_are_skipped_in_turn(policy: str) -> None:
    assert choose(ABC, {}, policy, 0, draining={"a"}) == "b"
    assert choose(ABC, {"a": 2, "b": 2, "c": 1}, policy, 0, cap=2) == "c"
    assert choose(ABC, {"c": 1}, policy, 2, draining={"a", "b"}, cap=1) is None
    assert choose([], {}, policy, 0) is None


def test_a_policy_that_is_not_round_robin_is_least_requests() -> None:
    assert choose(ABC, {"a": 3, "b": 1, "c": 2}, "something else", 0) == "b"
