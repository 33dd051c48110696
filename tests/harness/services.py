"""Where the services the tests use answer: Redis (under pytest-xdist a server of this worker's own, worker_redis.py)
and the Postgres server that each test or fleet creates its own database in."""

from __future__ import annotations

import os

from tests.harness.worker_redis import worker_redis_port

REDIS_HOST = os.environ.get("GSWARM_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = worker_redis_port() or int(os.environ.get("GSWARM_TEST_REDIS_PORT", "6379"))
PG_ADMIN = os.environ.get("GSWARM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
