"""The Redis broker transport the fleet's Celery app uses: kombu's, with one fix for a Redis that restarts.

When a worker loses its broker connection while it holds unacknowledged messages (a running task, acks late), Celery
closes the connection and kombu's channel, closing, puts those messages back on their queue. kombu 5.7 makes that
client from the transport's connection info after the connection has already dropped it, raises AttributeError
(``'NoneType' object has no attribute 'hostname'``), and Celery stops the whole worker as an unrecoverable error: a
node whose Redis restarted for a moment is gone until someone restarts it. Here a channel keeps the connection info
it was made with and uses it for that last client; if Redis is still away then, the messages stay in the broker's
unacked index, which brings them back after the visibility timeout, as for a worker that died.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client_info: Any = args[0].client if args else None  # the kombu Connection this channel serves
        super().__init__(*args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport.client is not None or self._client_info is None:
            return dict(super()._connparams(asynchronous))
        transport.client = self._client_info  # closing after the connection was lost: the info it was made with
        try:
            return dict(super()._connparams(asynchronous))
        finally:
            transport.client = None


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(url: str) -> str | None:
    """The transport to name for broker `url`: this module's for redis:// and rediss://, else kombu's choice."""
    return f"{__name__}:Transport" if url.split("://", 1)[0] in ("redis", "rediss") else None
