"""Real Redis, a fresh Postgres database per test, and Celery worker subprocesses."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from celery import Celery

from gswarm_tasks.celery_app import make_celery
from gswarm_tasks.settings import Settings
from tests.harness.app import make_settings
from tests.harness.procs import Proc, celery_worker
from tests.harness.redis_db import free_redis_db
from tests.harness.services import PG_ADMIN, REDIS_HOST, REDIS_PORT

pytestmark = pytest.mark.integration


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis database of this test's own (tests/harness/redis_db.py), empty, flushed and released after it."""
    with free_redis_db() as db:
        yield f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"gswarm_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fleet_env(home: Path, redis_url: str, pg_url: str) -> dict[str, str]:
    """Environment every process of one test shares: fast heartbeats, short timeouts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    env.update(
        GSWARM_HOME=str(home),
        GSWARM_CONFIG="",
        GSWARM_REDIS_URL=redis_url,
        GSWARM_DATABASE_URL=pg_url,
        GSWARM_HEARTBEAT_INTERVAL="0.5",
        GSWARM_HEARTBEAT_TIMEOUT="3",
        GSWARM_OFFLINE_AFTER="6",
        GSWARM_QUEUE_RETRY_COUNT="2",
        GSWARM_QUEUE_TASK_TIMEOUT="60",
        GSWARM_QUEUE_VISIBILITY_TIMEOUT="120",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def fleet_settings(fleet_env: dict[str, str]) -> Settings:
    return make_settings(
        Path(fleet_env["GSWARM_HOME"]),
        **{k: v for k, v in fleet_env.items() if k.startswith("GSWARM_") and k != "GSWARM_HOME"},
    )


@pytest.fixture
def sender(fleet_settings: Settings) -> Iterator[Celery]:
    """A Celery app in this test process, pointed at the test broker, for sending tasks."""
    app = make_celery(fleet_settings)
    yield app
    app.close()


@pytest.fixture
def procs(home: Path) -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop()


@pytest.fixture
def start_worker(procs: list[Proc], fleet_env: dict[str, str], home: Path):  # type: ignore[no-untyped-def]
    def start(app_module: str, queue: str, name: str, env: dict[str, str] | None = None, **kw) -> Proc:  # type: ignore[no-untyped-def]
        p = celery_worker(app_module, queue, name, {**fleet_env, **(env or {})}, home / "logs", **kw)
        procs.append(p.start())
        p.wait_log("ready.", timeout=60)
        return p

    return start
