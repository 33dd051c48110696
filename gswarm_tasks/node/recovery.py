"""Give back, at once, the tasks a node's previous worker took and never finished.

Redis keeps every delivered, unacknowledged message in the `unacked` hash and redelivers it only after
the visibility timeout, which must exceed the longest task (hours). A node's queue is served by that
node's worker alone, so when it starts, every message of its queue delivered before it started belongs
to a dead predecessor: it goes back to the queue now, and the step runs again within seconds.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def restore_orphans(app: Any, queue: str, started_at: float) -> int:
    """Requeue unacknowledged messages routed to `queue` that were delivered before `started_at`."""
    restored = 0
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        qos = channel.qos
        client = channel.client
        tags = client.zrangebyscore(channel.unacked_index_key, 0, started_at)
        for tag in tags:
            raw = client.hget(channel.unacked_key, tag)
            if raw is None:
                continue
            try:
                _payload, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if routing_key != queue:
                continue
            qos.restore_by_tag(tag.decode() if isinstance(tag, bytes) else tag, client=client, leftmost=True)
            restored += 1
    if restored:
        log.warning("requeued %d task(s) of %s left unfinished by its previous worker", restored, queue)
    return restored
