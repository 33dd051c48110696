"""The pick's two writings agree: the Lua script every web process runs in Redis (pick.PICK, atomic across
processes) and the Python rule every pick made in a process calls (pick.choose). Generated tables (replicas,
requests in flight with ties, draining replicas, caps, both policies and one the script does not know, turns) go
through both, three picks in a row on each table as the counts grow; every pick must be the same replica, and the
script must count the one it chose (and nothing when it chose none).

The script runs on the real Redis, in a database of this test's own (the `redis_url` fixture), each case's table
written and picked from in one MULTI/EXEC."""

from __future__ import annotations

import random

import redis

from gswarm_web.control.serving.config import LOAD_BALANCING
from gswarm_web.control.serving.pick import PICK, choose

CASES, PICKS = 400, 3
POLICIES = (*LOAD_BALANCING, "unknown")  # the script takes anything but round_robin as least_requests
IDS = [f"replica-{i}" for i in range(8)]
# the script's six keys: live counts, draining, version, this process's share, turns, processes
KEYS = [f"pick-twin:{k}" for k in ("live", "draining", "version", "share", "turns", "procs")]


def table(rng: random.Random) -> dict:
    """One generated case: candidates in their order, counts (ties likely, some missing, a few below zero), draining
    ones, a cap, a policy and the turn the script's counter gives."""
    n = rng.choice((0, 1, 2, 2, 3, 3, 4, 5, 6, 8))
    candidates = rng.sample(IDS, n)
    counts = {r: rng.choice((0, 0, 1, 1, 2, 3, 5, -1)) for r in candidates if rng.random() < 0.85}
    draining = {r for r in candidates if rng.random() < 0.2}
    return {
        "candidates": candidates,
        "counts": counts,
        "draining": draining,
        "cap": rng.choice((0, 0, 0, 1, 2, 3)),
        "policy": rng.choice(POLICIES),
        "turn": rng.randint(1, 10_000),
    }


def run_script(client: redis.Redis, sha: str, case: dict, proc: str) -> tuple[str | None, dict]:
    """The script's pick on the case's table (written in the same transaction), and the counts it left."""
    live, draining, version, share, turns, procs = KEYS
    pipe = client.pipeline(transaction=True)
    pipe.delete(*KEYS)
    if case["counts"]:
        pipe.hset(live, mapping={f"r:{r}": c for r, c in case["counts"].items()})
    if case["draining"]:
        pipe.sadd(draining, *case["draining"])
    pipe.set(version, "7")
    pipe.hset(turns, "m", case["turn"] - 1)  # the script takes the next turn: case["turn"]
    pipe.evalsha(sha, len(KEYS), *KEYS, "m", case["policy"], case["cap"], proc, *case["candidates"])
    pipe.hgetall(live)
    pipe.hgetall(share)
    pipe.smembers(procs)
    *_, (best, seen_version), after, shared, members = pipe.execute()
    assert seen_version == b"7"
    chosen = best.decode() if best is not None else None
    return chosen, {"live": after, "share": shared, "procs": members}


def test_the_script_and_choose_pick_the_same_replica_from_generated_tables(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    sha = client.script_load(PICK)
    rng = random.Random(20240611)
    picked = none = 0
    for number in range(CASES):
        case = table(rng)
        for step in range(PICKS):
            expected = choose(case["candidates"], case["counts"], case["policy"], case["turn"], case["draining"],
                              case["cap"])  # fmt: skip
            chosen, left = run_script(client, sha, case, "proc-1")
            assert chosen == expected, f"case {number}, pick {step + 1}: {case}"
            if chosen is None:  # the same table again would answer the same
                none += 1
                assert left["share"] == {} and left["procs"] == set()
                break
            picked += 1
            assert int(left["live"][f"r:{chosen}".encode()]) == case["counts"].get(chosen, 0) + 1
            assert left["share"] == {f"r:{chosen}".encode(): b"1"} and left["procs"] == {b"proc-1"}
            case["counts"] = {**case["counts"], chosen: case["counts"].get(chosen, 0) + 1}
            case["turn"] += 1
    assert picked > CASES and none > CASES // 20  # both outcomes well represented
