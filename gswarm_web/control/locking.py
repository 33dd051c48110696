"""Row locks: a check and the act it guards are one step.

`lock(Model, Model.id == 3)` makes the current transaction the only one working on that row until it commits: on
Postgres a `SELECT ... FOR UPDATE`; on SQLite, which has no row locks, an UPDATE that changes nothing takes the
database's write lock (the driver begins its transaction at the first write, so what is read after it is current).
Either way the row is read again, so the checks that follow see what the previous holder committed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import inspect

from ..extensions import db

T = TypeVar("T")


def lock(entity: type[T], *where: Any, skip_locked: bool = False) -> T | None:
    """Lock the row of `entity` matching `where` (one row) and return it, freshly loaded; None if it is gone (or,
    with `skip_locked`, held by another transaction: for sweeps that come back later rather than wait)."""
    if db.session.get_bind().dialect.name == "sqlite":
        pk = inspect(entity).primary_key[0]
        db.session.execute(
            db.update(entity).where(*where).values({pk.name: pk}).execution_options(synchronize_session=False)
        )
        query = db.select(entity).where(*where)
    else:
        query = db.select(entity).where(*where).with_for_update(of=entity, skip_locked=skip_locked)
    return db.session.scalars(query.execution_options(populate_existing=True)).first()
