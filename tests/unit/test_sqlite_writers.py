"""SQLite writers wait their turn: two greenlets of one gevent process writing at once both commit (SQLite's own busy
wait sleeps in C, which stopped the greenlet that held the lock, so the second writer failed after its timeout), and a
lock held past the wait is an OperationalError the API answers with 503, not a hang."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gswarm_web import sqlite as embedded
from tests.harness.app import bearer

TWO_GREENLETS = textwrap.dedent(
    """
    from gevent import monkey; monkey.patch_all()
    import json, sys, time, gevent
    from sqlalchemy import create_engine, event, text
    from gswarm_web.sqlite import ENGINE_OPTIONS, pragmas

    engine = create_engine("sqlite:///" + sys.argv[1], **ENGINE_OPTIONS)
    event.listen(engine, "connect", pragmas)
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (who TEXT)"))
    done = {}

    def holder():
        with engine.begin() as c:
            c.execute(text("INSERT INTO t VALUES ('holder')"))
            gevent.sleep(0.5)  # holds the write lock while it waits on something else (a Redis call, say)
        done["holder"] = time.monotonic()

    def second():
        gevent.sleep(0.1)
        t0 = time.monotonic()
        with engine.begin() as c:
            c.execute(text("INSERT INTO t VALUES ('second')"))
        done["second"] = time.monotonic()
        done["second_waited"] = done["second"] - t0

    gevent.joinall([gevent.spawn(holder), gevent.spawn(second)], raise_error=True)
    with engine.connect() as c:
        rows = [r[0] for r in c.execute(text("SELECT who FROM t ORDER BY rowid"))]
    print(json.dumps({"rows": rows, **done}))
    """
)


def test_two_writers_of_one_gevent_process_both_commit(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", TWO_GREENLETS, str(tmp_path / "db.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["rows"] == ["holder", "second"]
    # the second writer waited for the holder's commit, not for a timeout
    assert got["holder"] <= got["second"] and 0.3 < got["second_waited"] < 3.0


def test_a_lock_held_past_the_wait_fails_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "WAIT_S", 0.3)
    path = str(tmp_path / "db.sqlite")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    writer = sqlite3.connect(path, factory=embedded.WaitingConnection, timeout=0)
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError) as caught:
        writer.execute("INSERT INTO t VALUES (1)")
    assert embedded.busy(caught.value)
    assert 0.25 < time.monotonic() - t0 < 2.0
    holder.execute("COMMIT")
    writer.cursor().execute("INSERT INTO t VALUES (2)")  # free again: the next write goes through
    writer.commit()
    assert holder.execute("SELECT x FROM t").fetchall() == [(2,)]


def test_only_a_lock_is_waited_for(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / "db.sqlite"), factory=embedded.WaitingConnection, timeout=0)
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        conn.cursor().execute("INSERT INTO missing VALUES (1)")
    assert time.monotonic() - t0 < 0.2


def test_a_write_that_cannot_get_the_lock_is_503_with_retry_after(
    app: Any, client: Any, admin_token: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "WAIT_S", 0.3)
    path = settings.effective_database_url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing for longer than a request waits
    try:
        r = client.post(
            "/api/v1/tokens", json={"name": "late", "role": "read-only"}, headers=bearer(admin_token)
        )
    finally:
        holder.execute("ROLLBACK")
    from gswarm_web.extensions import db

    db.session.remove()  # as the end of each request does (the tests share one app context)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json["error"]["code"] == "RESOURCE_UNAVAILABLE"
    names = [t["name"] for t in client.get("/api/v1/tokens", headers=bearer(admin_token)).json]
    assert "late" not in names  # nothing of it was kept
    r = client.post("/api/v1/tokens", json={"name": "late", "role": "read-only"}, headers=bearer(admin_token))
    assert r.status_code == 201
