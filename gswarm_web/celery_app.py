"""The control worker: `celery -A gswarm_web.celery_app worker -Q control`.

It alone touches the database on behalf of the fleet. Here it is put together: the Flask app its tasks run in,
its beat jobs, and its stream consumers: the one intake of node reports (each kind routed to the bookkeeping of
its resource), the heartbeats, and the profiler's frames.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery.signals import worker_process_init

from gswarm_tasks import names
from gswarm_tasks.celery_app import app as celery
from gswarm_tasks.celery_app import settings_of
from gswarm_tasks.node import lifecycle  # noqa: F401  (a step that dies with its process is reported here too)

# steps that need no device, like health checks, run on the control queue
from gswarm_tasks.workflows import step_task  # noqa: F401

from . import create_app
from .control import dispatch, task_state
from .control.data import collector as chunk_collector
from .control.intake import Intake
from .control.nodes import state as node_state
from .control.serving import reconciler
from .control.serving import state as service_state
from .control.serving.autoscaler import AutoscalerLoop
from .control.sessions.consumer import frames_consumer
from .control.worker import ControlConsumers, ControlTask, StreamConsumer
from .extensions import db
from .workflows import chains
from .workflows import step_reports as events

log = logging.getLogger(__name__)

settings = settings_of(celery)
flask_app = create_app(settings)
ControlTask.flask_app = flask_app


@celery.task(name=names.SWEEP_NODES, base=ControlTask)
def sweep_nodes() -> list[list[str]]:
    """Record node status changes (healthy -> unhealthy -> offline) and log each one."""
    return [list(c) for c in node_state.sweep(settings.heartbeat_timeout_s, settings.offline_after_s)]


@celery.task(name=names.SWEEP_OUTBOX, base=ControlTask)
def sweep_outbox() -> int:
    """Send what was decided but never reached the broker (workflow chains, operations), and the operations whose
    message reached it but no node (one taken by a worker killed in its read) for two heartbeat timeouts."""
    sent = chains.resend_undispatched() + dispatch.resend_unsent()
    return sent + dispatch.resend_untaken(2 * settings.heartbeat_timeout_s)


@celery.task(name=names.DATA_GC, base=ControlTask)
def data_gc() -> dict[str, int]:
    """Collect unreferenced intermediate chunks past their TTL, then bring dram tiers under capacity."""
    done = chunk_collector.collect_garbage()
    dispatch.send_recorded()
    return done


@celery.task(name=names.SERVICE_SWEEP, base=ControlTask)
def services_sweep() -> int | None:
    """Keep every auto service at its replica count: place, replace, scale, unload idle ones, wake called ones."""
    try:
        recorded = reconciler.reconcile()
        db.session.commit()
    except BaseException:
        db.session.rollback()
        dispatch.forget_recorded()
        raise
    dispatch.send_recorded()
    return recorded


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.effective_redis_url, socket_timeout=10, socket_connect_timeout=5)


def reports_consumer(consumer: str) -> StreamConsumer:
    """The one intake: operation reports, step reports and service health, in that order within a batch."""
    with flask_app.app_context():
        try:
            chains.resend_undispatched(0)
        except Exception as exc:  # the beat sweep tries again
            log.warning("resending undispatched steps failed: %s", exc)
    intake = Intake(
        flask_app,
        {
            names.REPORT_OPERATION: task_state.apply_reports,
            names.REPORT_STEP: events.apply_reports,
            names.REPORT_SERVICES: service_state.apply_reports,
        },
    )
    return StreamConsumer(
        _client(),
        names.REPORTS_STREAM,
        names.CONTROL_GROUP,
        intake,
        consumer,
        batch=2000,
        min_interval_s=0.05,
    )


def heartbeats_consumer(consumer: str) -> StreamConsumer:
    def handle(entries: list[tuple[Any, dict[Any, Any]]]) -> None:
        with flask_app.app_context():
            node_state.apply_heartbeats(entries)

    return StreamConsumer(
        _client(), names.HEARTBEAT_STREAM, names.CONTROL_GROUP, handle, consumer, min_interval_s=0.5
    )


ControlConsumers.builders = [
    heartbeats_consumer,
    reports_consumer,
    lambda consumer: frames_consumer(settings.effective_redis_url, consumer, flask_app),
    lambda consumer: AutoscalerLoop(flask_app, consumer),
]
celery.steps["worker"].add(ControlConsumers)


@worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    # A forked pool child must not reuse the parent's database connections.
    with flask_app.app_context():
        db.engine.dispose(close=False)


__all__ = ["celery", "flask_app"]
