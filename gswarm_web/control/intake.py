"""The one intake of node reports: the control worker reads the reports stream through one consumer group and
hands each report, by kind, to the bookkeeping of its resource.

A batch is applied kind by kind in stream order, so the reports of one operation or step are applied in the
order their node sent them, and each kind's share in one transaction; the operations that bookkeeping recorded
are sent after the commit. A report that fails on its own (not for a database or Redis outage, which leaves the
batch pending to be read again) is logged and kept in the dead-report stream, so one bad report cannot stop the
rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import redis
from flask import Flask
from sqlalchemy.exc import InterfaceError, OperationalError

from gswarm_tasks import names
from gswarm_tasks.errors import NetworkError

from ..extensions import db, redis_client
from .dispatch import forget_recorded, send_recorded
from .report import Report, parse_reports

log = logging.getLogger(__name__)

# A route applies reports of one kind in the current transaction and may return what to do after the commit.
Route = Callable[[list[Report]], Callable[[], None] | None]
TRANSIENT = (OperationalError, InterfaceError, redis.RedisError)


class Intake:
    """Applies batches of stream entries (the handler of the reports stream's consumer)."""

    def __init__(self, flask_app: Flask, routes: dict[str, Route]) -> None:
        self.flask_app = flask_app
        self.routes = routes
        self.applied = 0

    def __call__(self, entries: list[tuple[Any, dict[Any, Any]]]) -> None:
        reports = parse_reports(entries)
        with self.flask_app.app_context():
            for kind in sorted({r.kind for r in reports} - set(self.routes)):
                log.warning("no bookkeeping for reports of kind %r; dropped", kind)
            for kind, route in self.routes.items():
                batch = [r for r in reports if r.kind == kind]
                if batch:
                    self._apply(route, batch)
            self.applied += len(reports)

    def _apply(self, route: Route, batch: list[Report]) -> None:
        try:
            after = self._commit(route, batch)
        except TRANSIENT:
            raise  # the batch stays pending and is read again
        except Exception:
            log.exception(
                "a batch of %d %s report(s) failed; applying them one by one", len(batch), batch[0].kind
            )
            for r in batch:
                try:
                    self._finish(self._commit(route, [r]))
                except TRANSIENT:
                    raise
                except Exception:
                    log.exception("dropping report %s %s of %s", r.kind, r.event, r.id)
                    self._dead(r)
            return
        self._finish(after)

    def _commit(self, route: Route, batch: list[Report]) -> Callable[[], None] | None:
        try:
            after = route(batch)
            db.session.commit()
        except BaseException:
            db.session.rollback()
            forget_recorded()
            raise
        return after

    def _finish(self, after: Callable[[], None] | None) -> None:
        try:
            send_recorded()
        except NetworkError as exc:  # marked failed; the operations' owners see it
            log.warning("follow-up operations were refused by the broker: %s", exc)
        if after is not None:
            after()

    def _dead(self, r: Report) -> None:
        doc = {
            "kind": r.kind,
            "id": r.id,
            "event": r.event,
            "time": r.time,
            "data": r.data,
            "workflow_id": r.workflow_id,
        }
        try:
            redis_client().xadd(
                names.DEAD_REPORTS_STREAM, {"event": json.dumps(doc)}, maxlen=100_000, approximate=True
            )
        except redis.RedisError as exc:
            log.warning("could not keep the dead report: %s", exc)
