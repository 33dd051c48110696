"""SQLite, the embedded default's database: WAL, foreign keys, and writers that wait their turn without stopping
their process.

SQLite's own busy wait sleeps inside the C library. In a gevent web worker that sleep stops every greenlet of the
process, the one that holds the write lock included, so a second writer in the same process waited out the whole
timeout and failed (`database is locked`, a 500). Here the library never waits (busy timeout 0): a statement that
finds the database locked is tried again after a short sleep, which gevent turns into a switch, for up to
WAIT_S. The driver begins a transaction at its first write, so a locked first write changed nothing and can be
sent again; a later statement of the transaction holds the lock already.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

WAIT_S = 10.0  # as long as SQLite's busy timeout was: then the API answers 503 with Retry-After
FIRST_SLEEP_S = 0.0005
LONGEST_SLEEP_S = 0.02


def busy(exc: sqlite3.OperationalError) -> bool:
    """Whether the database was locked by another connection (waiting helps), not broken or misused."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "database is locked" in str(exc)
    # SQLITE_BUSY_SNAPSHOT (a read transaction that tries to write after another commit) never clears by waiting.
    return code & 0xFF == sqlite3.SQLITE_BUSY and code != getattr(sqlite3, "SQLITE_BUSY_SNAPSHOT", 517)


def patiently(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, tried again while the database is locked, for up to WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    pause = FIRST_SLEEP_S
    while True:
        try:
            return call(*args)
        except sqlite3.OperationalError as exc:
            if not busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # gevent's sleep under the web server's workers: the lock holder runs meanwhile
        pause = min(pause * 2, LONGEST_SLEEP_S)


class WaitingCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> WaitingCursor:
        return patiently(super().execute, sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> WaitingCursor:
        rows = seq_of_parameters if isinstance(seq_of_parameters, list | tuple) else list(seq_of_parameters)
        return patiently(super().executemany, sql, rows)


class WaitingConnection(sqlite3.Connection):
    """A connection whose cursors and commits wait for the write lock cooperatively."""

    def cursor(self, factory: Any = WaitingCursor) -> Any:
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.cursor().execute(sql, parameters)

    def commit(self) -> None:
        patiently(super().commit)


ENGINE_OPTIONS: dict[str, Any] = {"connect_args": {"factory": WaitingConnection, "timeout": 0}}


def pragmas(dbapi_conn: Any, _record: Any) -> None:
    """Per connection: WAL lets readers go on while one writes; foreign keys are off by default in SQLite."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=0")
    cur.execute("PRAGMA journal_mode=WAL")
    # WAL with NORMAL: a commit is appended to the log without an fsync of its own (a checkpoint syncs); a crash of
    # gswarm loses nothing, a power cut may lose the last commits, never the file. One fsync a write was most of a
    # POST /data's time on this default (Postgres is the store for a cluster).
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
