"""The Celery app of the fleet: Redis broker and results, JSON only, one queue per node plus `control`.

Node tasks register on `app`; `gswarm_tasks.node.worker` imports every one of them with the worker's hooks.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task
from kombu.transport import redis as kombu_redis

from . import names
from .devices import validate_node_name
from .errors import InvalidRequest, RedeliveryLimitExceeded
from .settings import RETRY_COUNT, Settings, load_settings

log = logging.getLogger(__name__)


class GswarmTask(Task):
    """Base of every gswarm task: late acks, redelivery on worker loss, and a cap on redeliveries.

    Celery re-sends a task whose pool process died (`task_retry_on_worker_lost`) up to `max_retries`
    times and then fails it. A whole worker killed mid-task leaves its message unacknowledged in Redis,
    which redelivers it; `before_start` counts those deliveries per attempt so a task that kills its
    worker every time also ends failed instead of looping.
    """

    acks_late = True
    reject_on_worker_lost = True
    # A worker-loss retry waits this long; explicit retries always pass their own countdown.
    default_retry_delay = 1

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        client = getattr(self.app.backend, "client", None)
        if client is None or self.request.is_eager:
            return
        key, starts = names.deliveries_key(task_id, self.request.retries or 0), names.starts_key(task_id)
        keep = int(self.app.conf.broker_transport_options.get("visibility_timeout", 3600)) * 4
        pipe = client.pipeline()
        pipe.incr(key)
        pipe.expire(key, keep)
        pipe.incr(starts)
        pipe.expire(starts, keep)
        self.prefetch(pipe, args, kwargs)
        replies = pipe.execute()
        count = int(replies[0])
        self.request.gswarm_starts = int(
            replies[2]
        )  # the attempt a step reports: a crash's redelivery counts
        self.request.gswarm_prefetched = replies[4:]
        cap = int(self.app.conf.get("gswarm_max_redeliveries", RETRY_COUNT))
        if count > cap + 1:
            raise RedeliveryLimitExceeded(
                f"task {self.name}[{task_id}] was delivered {count} times without finishing; giving up",
                {"task_id": task_id, "deliveries": count, "cap": cap},
            )

    def prefetch(self, pipe: Any, args: Any, kwargs: Any) -> None:
        """Reads a task wants before it runs, queued on the delivery count's round trip; their replies are in
        `self.request.gswarm_prefetched` (absent when the task runs eagerly)."""


class NodeTask(GswarmTask):
    """A task that runs on one node: it must be sent to that node's queue, never to a default one."""

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        if not (options.get("queue") or options.get("routing_key")) and not self.app.conf.task_always_eager:
            raise InvalidRequest(
                f"{self.name} runs on a node: send it with send_to_node(node, ...)", {"task": self.name}
            )
        return super().apply_async(args, kwargs, task_id, **options)


def priority_value(name: str | int | None) -> int:
    """Broker priority for a name (`critical|high|normal|low`) or an int 0-9; Redis serves 0 first."""
    if name is None:
        return names.PRIORITIES["normal"]
    if isinstance(name, int) and not isinstance(name, bool) and 0 <= name <= 9:
        return name
    if isinstance(name, str) and name in names.PRIORITIES:
        return names.PRIORITIES[name]
    raise InvalidRequest(
        f"priority: {name!r} is not one of {', '.join(names.PRIORITIES)}",
        {"field": "priority", "value": name},
    )


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for `settings`; everything that makes the fleet behave lives here."""
    url = settings.effective_redis_url
    return {
        "broker_url": url,
        "broker_transport": transport_for(url),  # kombu's Redis transport, surviving a Redis restart (below)
        "result_backend": url,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "timezone": "UTC",
        "enable_utc": True,
        "task_default_queue": names.CONTROL_QUEUE,
        "task_create_missing_queues": True,
        "task_routes": {names.CONTROL_TASKS: {"queue": names.CONTROL_QUEUE}},
        "task_default_priority": names.PRIORITIES["normal"],
        "task_acks_late": True,
        "task_acks_on_failure_or_timeout": True,
        "task_reject_on_worker_lost": True,
        "task_retry_on_worker_lost": True,
        "task_annotations": {"*": {"max_retries": settings.retry_count}},
        "gswarm_max_redeliveries": settings.retry_count,
        "task_time_limit": settings.task_timeout_s,
        "task_track_started": True,
        # Events cost a Redis PUBLISH per task and state change; Flower turns the workers' on when it watches.
        "task_send_sent_event": settings.task_events,
        "worker_send_task_events": settings.task_events,
        "worker_prefetch_multiplier": 1,
        # A running task goes on through a broker outage (a Redis restart): cancelling it would leave its message in the
        # broker's unacked index until the visibility timeout (hours). Its report goes out once Redis is back; the
        # message, which the lost channel cannot acknowledge, comes back later and finds the task done (idempotent).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "priority_steps": names.PRIORITY_STEPS,
            "sep": ":",
            "queue_order_strategy": "priority",
        },
        "result_extended": True,
        "result_expires": 7 * 24 * 3600,
        # In-memory beat schedule: the default shelve file would pickle.
        "beat_scheduler": "celery.beat:Scheduler",
        "beat_schedule": {
            "gswarm-workflow-sweep": {
                "task": names.SWEEP_OUTBOX,
                "schedule": 10.0,
                "options": {"queue": names.CONTROL_QUEUE, "expires": 10.0},
            },
            "gswarm-data-gc": {
                "task": names.DATA_GC,
                "schedule": max(1.0, settings.data_gc_interval_s),
                "options": {"queue": names.CONTROL_QUEUE, "expires": max(1.0, settings.data_gc_interval_s)},
            },
            "gswarm-services": {
                "task": names.SERVICE_SWEEP,
                "schedule": 2.0,
                "options": {"queue": names.CONTROL_QUEUE, "expires": 2.0},
            },
            "gswarm-node-sweep": {
                "task": names.SWEEP_NODES,
                "schedule": max(1.0, settings.heartbeat_interval_s),
                "options": {"queue": names.CONTROL_QUEUE, "expires": max(1.0, settings.heartbeat_interval_s)},
            },
        },
    }


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or load_settings()
    app = Celery("gswarm", task_cls=GswarmTask)
    app.conf.update(celery_config(settings))
    app.gswarm_settings = settings
    return app


def configure(app: Celery, settings: Settings) -> None:
    """Re-point an existing app at other settings (tests and `gswarm up` use this)."""
    app.conf.update(celery_config(settings))
    app.gswarm_settings = settings


def settings_of(app: Celery) -> Settings:
    settings: Settings | None = getattr(app, "gswarm_settings", None)
    if settings is None:
        settings = load_settings()
        app.gswarm_settings = settings
    return settings


def send_to_node(
    app: Celery,
    node: str,
    task_name: str,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    priority: str | int | None = None,
    **options: Any,
) -> Any:
    """Send a node task to exactly that node's queue."""
    validate_node_name(node, "node")
    return app.send_task(
        task_name,
        args=args,
        kwargs=kwargs,
        queue=node,
        routing_key=node,
        priority=priority_value(priority),
        **options,
    )


# The Redis broker transport: kombu's, with one fix for a Redis that restarts.
#
# When a worker loses its broker connection while it holds unacknowledged messages (a running task, acks late), Celery
# closes the connection and kombu's channel, closing, puts those messages back on their queue. kombu 5.7 makes that
# client from the transport's connection info after the connection has already dropped it, raises AttributeError
# (``'NoneType' object has no attribute 'hostname'``), and Celery stops the whole worker as an unrecoverable error: a
# node whose Redis restarted for a moment is gone until someone restarts it. Here a channel keeps the connection info
# it was made with and uses it for that last client; if Redis is still away then, the messages stay in the broker's
# unacked index, which brings them back after the visibility timeout, as for a worker that died.
class Channel(kombu_redis.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client_info: Any = args[0].client if args else None  # the kombu Connection this channel serves
        super().__init__(*args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport.client is not None or self._client_info is None:
            return dict(super()._connparams(asynchronous))
        transport.client = (
            self._client_info
        )  # closing after the connection was lost: the info it was made with
        try:
            return dict(super()._connparams(asynchronous))
        finally:
            transport.client = None


class Transport(kombu_redis.Transport):
    Channel = Channel


def transport_for(url: str) -> str | None:
    """The transport to name for broker `url`: this module's for redis:// and rediss://, else kombu's choice."""
    return f"{__name__}:Transport" if url.split("://", 1)[0] in ("redis", "rediss") else None


app = make_celery()
