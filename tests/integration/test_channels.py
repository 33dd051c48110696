"""Two clusters on one Redis server, each in a database of its own, do not hear each other: Redis' pub/sub channels
belong to the server, so gswarm names its channels with the database (real Redis, two apps, the events hub)."""

from __future__ import annotations

import contextlib
import json
import queue
import time
from pathlib import Path

from gswarm_web.api.events import Hub
from gswarm_web.control import events
from tests.harness.app import build_app, make_settings
from tests.harness.redis_db import free_redis_db
from tests.harness.services import REDIS_HOST, REDIS_PORT


def test_a_clusters_events_reach_its_own_listeners_only(tmp_path: Path) -> None:
    with free_redis_db() as a_db, free_redis_db() as b_db:
        urls = {name: f"redis://{REDIS_HOST}:{REDIS_PORT}/{n}" for name, n in (("a", a_db), ("b", b_db))}
        apps = {
            name: build_app(make_settings(tmp_path / name, GSWARM_REDIS_URL=url))
            for name, url in urls.items()
        }
        hub = Hub()
        listener = hub.join(urls["b"], set())  # cluster b's web process, listening
        heard: list[str] = []
        deadline = time.monotonic() + 30
        # Until b's own event arrives (the hub subscribes on a thread of its own; a publish after a refused one
        # waits a few seconds), each round publishes a's event first: were it heard on b's channel, it would come
        # first, as Redis delivers in the order it published.
        while "from-b" not in heard and time.monotonic() < deadline:
            for name in ("a", "b"):
                with apps[name].app_context():
                    events.publish([{"type": "node", "id": f"from-{name}", "time": 0}])
            with contextlib.suppress(queue.Empty):
                heard.append(json.loads(listener.queue.get(timeout=1.0))["id"])
        assert "from-b" in heard and "from-a" not in heard, heard
