"""The gateway's pick without a Redis round trip (control/live.py): from the whole gateway's counts as the last flush
read them back, plus this process's changes not sent yet; the script's pick when that read is stale. Two shares stand
for two web processes, on a real Redis."""

from __future__ import annotations

import time

import redis

from gswarm_tasks import names
from gswarm_web.control.serving import live
from gswarm_web.control.serving.stats import Outcome, stats_key

X, Y = "rx", "ry"


def share(client: redis.Redis) -> live.Share:
    """A web process's share whose outbox this test flushes by hand (its flusher thread is never started)."""
    s = live.Share(client)
    s.flushing = True
    return s


def in_redis(client: redis.Redis, replica: str) -> int:
    return int(client.hget(names.SERVE_LIVE_KEY, f"r:{replica}") or 0)


def finish(share: live.Share, replica: str) -> None:
    """A request of `replica` answered: its count-out joins the share's outbox."""
    share.count_out(
        [stats_key(replica), names.SERVE_LIVE_KEY, share.key], [f"r:{replica}", *Outcome(200, 0.01).args()]
    )


def test_a_fresh_read_picks_the_replica_with_fewest_in_the_whole_gateway_without_a_round_trip(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    a, b = share(client), share(client)
    assert a.pick_local("m", "least_requests", [X, Y]) is None  # nothing read yet: the script decides
    for _ in range(2):  # the other process holds two requests on X
        assert b.pick("m", "least_requests", 0, [X])[0] == X
    chosen, _ = a.pick("m", "least_requests", 0, [X, Y])
    assert chosen == Y
    finish(a, Y)
    assert a.flush() == 1
    assert (a.seen.get(f"r:{X}"), a.seen.get(f"r:{Y}")) == (2, 0)

    picks = [a.pick_local("m", "least_requests", [X, Y]) for _ in range(3)]
    assert [p[0] for p in picks if p] == [Y, Y, X] or [p[0] for p in picks if p] == [Y, Y, Y]
    assert in_redis(client, Y) == 0  # counted in this process only, so far
    assert a.pending[f"r:{Y}"] >= 2
    a.flush()
    assert in_redis(client, X) + in_redis(client, Y) == 5  # b's two, a's three: every count-in reached Redis
    assert a.pending == {}


def test_a_draining_replica_is_skipped_once_read_and_a_stale_read_asks_the_script(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    a = share(client)
    chosen, _ = a.pick("m", "least_requests", 0, [X, Y])
    assert chosen is not None
    live.drain(client, [Y])
    finish(a, chosen)
    a.flush()
    assert Y in a.seen_draining
    assert {a.pick_local("m", "least_requests", [X, Y])[0] for _ in range(4)} == {X}  # type: ignore[index]
    assert a.pick_local("m", "least_requests", [Y]) == (None, a.seen_version)
    a.seen_at = time.monotonic() - live.FRESH_S - 0.1
    assert a.pick_local("m", "least_requests", [X, Y]) is None


def test_round_robin_takes_each_replica_in_turn_from_the_local_read(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    a = share(client)
    chosen, _ = a.pick("m", "round_robin", 0, [X, Y])
    finish(a, str(chosen))
    a.flush()
    picked = [a.pick_local("m", "round_robin", [X, Y])[0] for _ in range(4)]  # type: ignore[index]
    assert picked[0] != picked[1] and picked[:2] == picked[2:]
    a.flush()
    assert in_redis(client, X) == in_redis(client, Y) == 2
