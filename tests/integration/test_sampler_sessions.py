"""A node's sampler on a real Redis takes a session's rate as soon as the session is announced, not a period later."""

from __future__ import annotations

import json
import time

import redis

from gswarm_tasks import names
from gswarm_tasks.profiling.nvml import FakeGpuSource
from gswarm_tasks.profiling.sampler import Sampler
from tests.harness.procs import wait_for


def frame_times(client: redis.Redis, node: str) -> list[float]:
    return [json.loads(f[b"data"])["time"] for _, f in client.xrange(names.frames_stream(node))]


def test_a_started_session_sets_the_rate_at_once_and_a_stopped_one_gives_it_back(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    sampler = Sampler(client, "n1", default_period_s=5.0, source=FakeGpuSource(1))
    sampler.start()
    try:
        wait_for(lambda: frame_times(client, "n1"), 10, "the first frame at the default rate")
        assert sampler.listening.wait(10), "the sampler never subscribed to the sessions' announcements"
        announced = time.time()
        pipe = client.pipeline(transaction=True)  # what the control plane does when a session starts
        pipe.hset(names.PROFILER_SESSIONS_KEY, "s", json.dumps({"freq_ms": 100, "nodes": ["n1"]}))
        pipe.publish(names.channel(names.PROFILER_SESSIONS_CHANNEL, client), "s")
        pipe.execute()

        def after() -> list[float] | None:
            times = [t for t in frame_times(client, "n1") if t >= announced]
            return times[:5] if len(times) >= 5 else None

        fast = wait_for(after, 10, "five frames at the session's rate")
        # The default period is 5 s: without the announcement the first fast frame would come up to a second later.
        assert fast[0] - announced < 0.4, fast[0] - announced
        gaps = [b - a for a, b in zip(fast, fast[1:], strict=False)]
        assert all(g < 0.3 for g in gaps), gaps
        pipe = client.pipeline(transaction=True)
        pipe.hdel(names.PROFILER_SESSIONS_KEY, "s")
        pipe.publish(names.channel(names.PROFILER_SESSIONS_CHANNEL, client), "s")
        pipe.execute()
        wait_for(lambda: sampler.period_s == 5.0, 2, "the default rate back")
    finally:
        sampler.stop()
