"""A Redis database of its own for each fleet, test or benchmark, claimed on the test Redis server for as long as it
is used: no table of numbers to keep, and two pytest processes (or a test and a benchmark) on one server never get
the same database.

A claim is the key `gswarm-test:db:<n>` in database 0, set only if absent (SET NX) with a time to live and a token
naming its holder (host, pid, xdist worker). A process takes the first database whose key it could set and that is
empty, else (none empty is free) the first whose key it could set, flushed. A thread of this process renews the key's
time to live while the claim is held; releasing it flushes the database and deletes the key, if the token there is
still ours. A process that dies without releasing blocks its databases for TTL_S at most. Database 0 holds the
claims only and is never handed out, so nothing flushes them.

    with free_redis_db() as db: ...            # a database number; or the `redis_db` fixture (tests/conftest.py)
    claim = claim_redis_db(); claim.release()  # the same, for a holder that is not a with block (a Fleet)
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError
from redis.lock import Lock

from tests.harness.services import REDIS_HOST, REDIS_PORT

CLAIMS_DB = 0
KEY = "gswarm-test:db:{}"
TTL_S = 60
RENEW_S = 10
DEFAULT_DATABASES = 16  # redis-server's default, for a server that refuses CONFIG GET


class RedisDb:
    """A claimed database: its number, its URL, and `release()` (flush it and give it back; once is enough)."""

    def __init__(self, host: str, port: int, db: int, lock: Lock) -> None:
        self.host, self.port, self.db = host, port, db
        self.url = f"redis://{host}:{port}/{db}"
        self._lock = lock
        self._mutex = threading.Lock()  # a renewal never runs after the release (it would take the key again)
        self._released = False

    def renew(self) -> None:
        """Reset the claim's time to live; take it again if it expired and nobody took it meanwhile."""
        with self._mutex:
            if self._released:
                return
            try:
                self._lock.reacquire()
            except LockError:
                if not self._lock.acquire(blocking=False, token=self._lock.local.token):
                    holder = self._lock.redis.get(self._lock.name)
                    print(
                        f"the claim on Redis db {self.db} ({self.url}) expired and is now held by {holder!r}: "
                        "this process was stopped for longer than the claim's time to live",
                        file=sys.stderr,
                    )

    def release(self) -> None:
        with self._mutex:
            if self._released:
                return
            self._released = True
        _renewer.discard(self)
        if not self._lock.owned():
            return  # expired and perhaps taken since: neither the database nor the key is ours any more
        redis.Redis(host=self.host, port=self.port, db=self.db).flushdb()
        try:
            self._lock.release()
        except LockError:
            pass  # expired in the meantime: nothing of ours to delete


class _Renewer:
    """One daemon thread per process renewing every claim it holds, started with the first claim."""

    def __init__(self) -> None:
        self.held: set[RedisDb] = set()
        self.guard = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, claim: RedisDb) -> None:
        with self.guard:
            self.held.add(claim)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.run, name="redis-db-claims", daemon=True)
                self.thread.start()

    def discard(self, claim: RedisDb) -> None:
        with self.guard:
            self.held.discard(claim)

    def run(self) -> None:
        while True:
            time.sleep(RENEW_S)
            with self.guard:
                claims = list(self.held)
            for claim in claims:
                try:
                    claim.renew()
                except redis.RedisError as exc:  # the server restarting: try again next round
                    print(f"renewing the claim on Redis db {claim.db} failed: {exc!r}", file=sys.stderr)

    def release_all(self) -> None:
        with self.guard:
            claims = list(self.held)
        for claim in claims:
            try:
                claim.release()
            except redis.RedisError:
                pass


_renewer = _Renewer()
atexit.register(_renewer.release_all)


def _databases(client: redis.Redis) -> int:
    try:
        return int(str(client.config_get("databases")["databases"]))
    except (redis.ResponseError, KeyError, ValueError):
        return DEFAULT_DATABASES


def _owner() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"{socket.gethostname()}:{os.getpid()}{':' + worker if worker else ''}:{uuid.uuid4().hex[:8]}"


def claim_redis_db(host: str = REDIS_HOST, port: int = REDIS_PORT, wait_s: float = 120.0) -> RedisDb:
    """Claim a free database (1 and up) on the server, an empty one first; wait up to `wait_s` for one."""
    claims = redis.Redis(host=host, port=port, db=CLAIMS_DB)
    count = _databases(claims)
    deadline = time.monotonic() + wait_s
    while True:
        # Empty databases first: one with keys and no claim is a dead holder's leftovers, or a process that uses a
        # number of its own (an older checkout's tests, a `gswarm up` on this server); it is flushed only when no
        # empty database is free.
        for empty_only in (True, False):
            for db in range(1, count):
                claim = _try_claim(claims, host, port, db, empty_only)
                if claim is not None:
                    return claim
        if time.monotonic() > deadline:
            keys = [KEY.format(db) for db in range(1, count)]
            holders = {k: v for k, v in zip(keys, claims.mget(keys), strict=True) if v is not None}
            raise RuntimeError(
                f"no free Redis database on {host}:{port} after {wait_s:.0f} s; held: {holders}"
            )
        time.sleep(0.5)


def _try_claim(claims: redis.Redis, host: str, port: int, db: int, empty_only: bool) -> RedisDb | None:
    lock = claims.lock(KEY.format(db), timeout=TTL_S, thread_local=False)
    if not lock.acquire(blocking=False, token=_owner()):
        return None
    try:
        client = redis.Redis(host=host, port=port, db=db)
        taken = not (empty_only and client.dbsize())
        if taken:
            client.flushdb()
    except BaseException:
        lock.release()
        raise
    if not taken:
        lock.release()
        return None
    claim = RedisDb(host, port, db, lock)
    _renewer.add(claim)
    return claim


@contextmanager
def free_redis_db(host: str = REDIS_HOST, port: int = REDIS_PORT, wait_s: float = 120.0) -> Iterator[int]:
    """A database number of this block's own, empty at the start, flushed and released at the end."""
    claim = claim_redis_db(host, port, wait_s)
    try:
        yield claim.db
    finally:
        claim.release()
