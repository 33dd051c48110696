"""The gateway's live counts, shared by every web process in Redis: requests in flight per replica and requests
waiting per service (least_requests routes on them, the autoscaler scales on them), the replicas being drained, and
a version that changes whenever a replica starts or stops serving.

A pick is one Lua script (`pick.PICK`), so it is atomic across processes: among the candidates it skips draining
replicas (and those at the service's `max_in_flight`), takes the one with the fewest requests in flight in the whole
gateway (ties in turn, by a shared counter), counts the request and answers the replicas' version. Its rule is
`pick.choose`'s, which every pick made in Python calls. Each web process also
keeps its own share under a key of its own while a lease it renews lives: the share of a process that died
(gunicorn's timeout, SIGKILL) is taken back by `heal`, so a count cannot leak.

A request's count-out (and its measures) is not sent on its response's path: it joins this process's outbox, which a
flusher of its own sends in one pipelined round trip with whatever else finished meanwhile. With a keep-alive
client the count-out had run before the next request was read, so both Redis round trips sat on every request's
path. A count-out still in the outbox when its process dies is in the process's share, which `heal` takes back.

The flusher also reads the whole gateway's counts back in that round trip (with the draining replicas and the
version). A service with no `max_in_flight` is then picked for from that read, when it is at most FRESH_S old, plus
this process's count-ins and count-outs not sent yet, and its count-in joins the outbox too: no Redis round trip on
the request's path at all (a pick differs from the script's only by the other processes' requests of the last few
milliseconds). A service with `max_in_flight` is always picked for by the script: its bound holds across
processes only if the check and the count are one step.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import redis
from sqlalchemy import event, inspect
from sqlalchemy.orm import Session

from gswarm_tasks import names

from ...extensions import redis_client
from ...tables import Replica
from .pick import PICK, choose
from .stats import DONE

log = logging.getLogger(__name__)

LEASE_S = 15.0
RENEW_EVERY_S = 5.0
OUTBOX_MAX = (
    100_000  # count-outs kept while Redis is away (beyond it the oldest are dropped; heal cannot help)
)
RETRY_S = 0.5  # a flush that failed is tried again after this long
FRESH_S = 0.5  # a local pick trusts the gateway's counts read back this recently (else it asks the script)
CHANGED = "gswarm_serve_changed"  # session.info key: a replica started or stopped serving in this transaction

HEAL = """
local gone = 0
for _, p in ipairs(redis.call('smembers', KEYS[1])) do
  if redis.call('exists', ARGV[2] .. p) == 0 then
    local h = ARGV[1] .. p
    local kv = redis.call('hgetall', h)
    for i = 1, #kv, 2 do
      local v = tonumber(kv[i + 1])
      if v ~= 0 then redis.call('hincrby', KEYS[2], kv[i], -v) end
    end
    redis.call('del', h)
    redis.call('srem', KEYS[1], p)
    gone = gone + 1
  end
end
return gone
"""


class Share:
    """This web process's part of the live counts: its id, its lease, and the scripts it runs."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.pid = os.getpid()
        self.id = f"{socket.gethostname()}-{self.pid}-{uuid.uuid4().hex[:8]}"
        self.key = names.SERVE_PROC_PREFIX + self.id
        self.pick_script: Any = client.register_script(PICK)
        self.done_script: Any = client.register_script(DONE)
        self.renewing = False
        self.lock = threading.Lock()
        # (field, +1, [], []) a count-in; (field, -1, DONE's keys, its args) a count-out with its measures
        self.outbox: list[tuple[str, int, list[str], list[Any]]] = []
        self.wake = threading.Event()
        self.flushing = False
        # the gateway's counts as the last flush read them back, and what this process queued since
        self.seen: dict[str, int] = {}
        self.seen_draining: set[str] = set()
        self.seen_version = ""
        self.seen_at = float("-inf")
        self.pending: dict[str, int] = {}
        self.turns: dict[str, int] = {}

    def renew(self) -> None:
        """Keep the lease alive while the process lives (a thread of its own, started at the first pick)."""
        with self.lock:
            if self.renewing:
                return
            self.renewing = True
        threading.Thread(target=self._renew, name="gswarm-serve-lease", daemon=True).start()

    def _renew(self) -> None:
        while True:
            try:
                self.client.set(names.SERVE_LEASE_PREFIX + self.id, "1", px=int(LEASE_S * 1000))
            except redis.RedisError as exc:
                log.debug("lease renewal failed: %s", exc)
            time.sleep(RENEW_EVERY_S)

    def pick(self, model: str, policy: str, cap: int, candidates: list[str]) -> tuple[str | None, str]:
        """The chosen replica (counted in flight) or None, and the replicas' version."""
        self.renew()
        keys = [names.SERVE_LIVE_KEY, names.SERVE_DRAINING_KEY, names.SERVE_VERSION_KEY, self.key,
                names.SERVE_TURNS_KEY, names.SERVE_PROCS_KEY]  # fmt: skip
        best, version = self.pick_script(keys=keys, args=[model, policy, cap, self.id, *candidates])
        chosen = best.decode() if isinstance(best, bytes) else None
        return chosen, version.decode() if isinstance(version, bytes) else str(version)

    def pick_local(self, model: str, policy: str, candidates: list[str]) -> tuple[str | None, str] | None:
        """As `pick` for a service with no `max_in_flight` (the same rule: `pick.choose`, with a turn of this
        process's own), from the counts the flusher read back at most FRESH_S ago (None: none that fresh: ask
        `pick`); the count-in joins the outbox."""
        self.renew()
        with self.lock:
            if time.monotonic() - self.seen_at > FRESH_S:
                return None
            turn = self.turns.get(model, 0)
            self.turns[model] = turn + 1
            counts = {r: self.seen.get("r:" + r, 0) + self.pending.get("r:" + r, 0) for r in candidates}
            best = choose(candidates, counts, policy, turn, self.seen_draining)
            if best is None:
                return None, self.seen_version
            self._queue("r:" + best, 1, [], [])
            return best, self.seen_version

    def count_out(self, keys: list[str], args: list[Any]) -> None:
        """Queue a request's count-out (serve_stats.DONE with these keys and args) for the flusher to send."""
        with self.lock:
            self._queue(str(args[0]), -1, keys, args)

    def _queue(self, field: str, n: int, keys: list[str], args: list[Any]) -> None:
        """(under the lock) One more change of `field` for the flusher; the flusher started the first time."""
        self.outbox.append((field, n, keys, args))
        self.pending[field] = self.pending.get(field, 0) + n
        if len(self.outbox) > OUTBOX_MAX:
            del self.outbox[: len(self.outbox) - OUTBOX_MAX]
        if not self.flushing:
            self.flushing = True
            threading.Thread(target=self._flush_forever, name="gswarm-serve-outbox", daemon=True).start()
        self.wake.set()

    def flush(self) -> int:
        """Send every queued change in one pipelined round trip that also reads the gateway's counts back; how many
        (put back if Redis failed)."""
        with self.lock:
            batch, self.outbox = self.outbox, []
            pending, self.pending = self.pending, {}
        if not batch:
            return 0
        try:
            try:
                self._send(batch)
            except redis.exceptions.NoScriptError:  # Redis restarted: load the script, then send again
                self.done_script.sha = self.client.script_load(DONE)
                self._send(batch)
        except redis.RedisError:
            with self.lock:
                self.outbox[:0] = batch
                for field, n in pending.items():
                    self.pending[field] = self.pending.get(field, 0) + n
                self.seen_at = float("-inf")
            raise
        return len(batch)

    def _send(self, batch: list[tuple[str, int, list[str], list[Any]]]) -> None:
        # EVALSHA itself: a pipeline given Script objects asks SCRIPT EXISTS first, a round trip more per flush.
        pipe = self.client.pipeline(transaction=False)
        for field, n, keys, args in batch:
            if keys:
                pipe.evalsha(self.done_script.sha, len(keys), *keys, *args)
            else:
                self.add(pipe, field, n)
        pipe.hgetall(names.SERVE_LIVE_KEY)
        pipe.smembers(names.SERVE_DRAINING_KEY)
        pipe.get(names.SERVE_VERSION_KEY)
        replies = pipe.execute()
        live, draining, version = replies[-3:]
        with self.lock:
            self.seen = {k.decode(): int(v) for k, v in live.items()}
            self.seen_draining = {r.decode() for r in draining}
            self.seen_version = version.decode() if isinstance(version, bytes) else "0"
            self.seen_at = time.monotonic()

    def _flush_forever(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            try:
                self.flush()
            except redis.RedisError as exc:
                log.debug("count-outs not sent yet: %s", exc)
                time.sleep(RETRY_S)
                self.wake.set()

    def add(self, pipe: Any, field: str, n: int) -> None:
        """Count `n` more (or fewer) under `field` (`r:<replica>`, `w:<service>`), in the total and this share."""
        pipe.hincrby(names.SERVE_LIVE_KEY, field, n)
        pipe.hincrby(self.key, field, n)
        if n > 0:
            pipe.sadd(names.SERVE_PROCS_KEY, self.id)

    def waiting(self, service_id: str, n: int) -> None:
        """A request starts (1) or stops (-1) waiting for a replica of `service_id`."""
        self.renew()
        try:
            pipe = self.client.pipeline(transaction=True)
            self.add(pipe, f"w:{service_id}", n)
            pipe.execute()
        except redis.RedisError as exc:
            log.debug("waiting count not kept: %s", exc)


_shares: dict[int, Share] = {}
_lock = threading.Lock()


def share(client: redis.Redis) -> Share:
    """This process's share (a new one after a fork: a child is a process of its own)."""
    with _lock:
        found = _shares.get(os.getpid())
        if found is None:
            found = _shares[os.getpid()] = Share(client)
        return found


def heal(client: redis.Redis) -> int:
    """Take back the counts of web processes whose lease expired; how many there were."""
    return int(
        client.eval(
            HEAL,
            2,
            names.SERVE_PROCS_KEY,
            names.SERVE_LIVE_KEY,
            names.SERVE_PROC_PREFIX,
            names.SERVE_LEASE_PREFIX,
        )  # fmt: skip
    )


def counts(
    client: redis.Redis, replicas: list[str], services: list[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """(requests in flight per replica, requests waiting per service), over every web process."""
    fields = [f"r:{r}" for r in replicas] + [f"w:{s}" for s in services]
    if not fields:
        return {}, {}
    values = client.hmget(names.SERVE_LIVE_KEY, fields)
    got = [max(0, int(v or 0)) for v in values]
    return dict(zip(replicas, got[: len(replicas)], strict=True)), dict(
        zip(services, got[len(replicas) :], strict=True)
    )


def drain(client: redis.Redis, replica_ids: list[str]) -> None:
    """These replicas take no new request from now on (every web process's next pick skips them)."""
    if replica_ids:
        pipe = client.pipeline(transaction=True)
        pipe.sadd(names.SERVE_DRAINING_KEY, *replica_ids)
        pipe.incr(names.SERVE_VERSION_KEY)
        pipe.execute()


def forget(client: redis.Redis, replica_ids: list[str]) -> None:
    """Replicas that stopped: no longer draining, their (zero) counts dropped."""
    if replica_ids:
        pipe = client.pipeline(transaction=True)
        pipe.srem(names.SERVE_DRAINING_KEY, *replica_ids)
        pipe.hdel(names.SERVE_LIVE_KEY, *[f"r:{r}" for r in replica_ids])
        pipe.execute()


# ---- the version: bumped after a commit that started or stopped a replica's serving ----------------------------


def _after_flush(session: Session, _context: Any) -> None:
    for obj in (*session.new, *session.dirty):
        if isinstance(obj, Replica) and (
            obj in session.new or inspect(obj).attrs.status.history.has_changes()
        ):
            session.info[CHANGED] = True
            return


def _after_commit(session: Session) -> None:
    if not session.info.pop(CHANGED, False):
        return
    try:
        redis_client().incr(names.SERVE_VERSION_KEY)
    except Exception as exc:  # the gateway re-reads the replicas every second anyway
        log.debug("serving version not bumped: %s", exc)


def _after_rollback(session: Session) -> None:
    session.info.pop(CHANGED, None)


def install() -> None:
    """Bump the version after every commit that changed a replica's status (once per process)."""
    if not event.contains(Session, "after_flush", _after_flush):
        event.listen(Session, "after_flush", _after_flush)
        event.listen(Session, "after_commit", _after_commit)
        event.listen(Session, "after_rollback", _after_rollback)
