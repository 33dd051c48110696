"""The embedded default under concurrent writers: `gswarm up` on SQLite (four gevent web workers, the control worker
recording every chunk) takes chunk writes from eight client threads, single and in batches, while two busy loops hold
both cores, and answers none of them with a 5xx; every chunk it accepted becomes available."""

from __future__ import annotations

import base64
import collections
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.harness.local_up import LocalUp, start_up
from tests.harness.procs import wait_for

pytestmark = pytest.mark.serial  # a whole `gswarm up` and two busy loops

LOAD_S = 20.0
THREADS = 8
BATCH = 20


@pytest.fixture
def busy_cores() -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[LocalUp]:
    run = start_up(tmp_path, "loadnode")
    try:
        run.wait_healthy()
        yield run
    finally:
        run.proc.stop()


def chunk(tag: str) -> dict[str, str]:
    return {"data": base64.b64encode(os.urandom(4096)).decode(), "device": "loadnode:dram", "type": "input",
            "format": tag}  # fmt: skip


def test_concurrent_writers_get_no_5xx_on_sqlite(up: LocalUp, busy_cores: None) -> None:
    codes: collections.Counter[int] = collections.Counter()
    errors: list[str] = []
    accepted = collections.Counter[str]()
    local = threading.local()

    def session() -> requests.Session:
        if not hasattr(local, "s"):
            local.s = requests.Session()
        return local.s  # type: ignore[no-any-return]

    def client(i: int) -> None:
        end = time.monotonic() + LOAD_S
        while time.monotonic() < end:
            if i % 2:
                r = session().post(f"{up.api}/data", json=chunk("load"), headers=up.auth, timeout=60)
                n = 1
            else:
                body = {"chunks": [chunk("load") for _ in range(BATCH)]}
                r = session().post(f"{up.api}/data/batch", json=body, headers=up.auth, timeout=60)
                n = BATCH
            codes[r.status_code] += 1
            if r.status_code == 202:
                accepted["chunks"] += n
            elif r.status_code >= 500:
                errors.append(f"{r.status_code} {r.text[:300]}")

    with ThreadPoolExecutor(THREADS) as ex:
        list(ex.map(client, range(THREADS)))
    assert not errors, (dict(codes), errors[:3])
    assert set(codes) == {202}, dict(codes)
    assert codes[202] >= 40, dict(codes)  # the load was real: writers of all eight threads went through

    db = up.home / "gswarm.db"

    def available() -> bool:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            rows = dict(
                conn.execute("SELECT status, count(*) FROM data_chunks WHERE format = 'load' GROUP BY status")
            )
        assert not rows.get("failed"), rows
        return rows.get("available", 0) == accepted["chunks"]

    wait_for(available, 120, f"{accepted['chunks']} chunks to be available")
    assert "database is locked" not in (up.home / "logs" / "web.log").read_text()
