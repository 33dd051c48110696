"""A gateway request's attempts at replicas, the one loop the `/v1` fast path and its Flask view share: pick a
replica (or, when the caller can wait, wait in the bounded queue for one), send the request, and when the replica
fails before its first byte (it cannot be reached, answers 5xx, answers 401 because its key is a successor's, or
ends a stream before its first bytes) count it out as failed (set aside for a while) and try another, up to the
caller's number of attempts. What a replica that answered gets is the caller's: the client's response, the
request's count-out and its measures."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3

from .stats import Outcome
from .table import Directory, Target

ATTEMPTS = 3

# The caller's wait for a replica when none is free: (model, replicas tried, path) -> (the replica, seconds waited).
Wait = Callable[[str, set[str], str], tuple[Target, float]]


@dataclass
class Answered:
    """A replica that answered: its response (not read yet when a stream), which attempt it was, the seconds the
    request waited for a replica, and for a stream its first bytes (read before the client gets anything) and the
    rest."""

    target: Target
    resp: Any
    attempts: int
    queue_s: float = 0.0
    first: bytes = b""
    rest: Iterator[bytes] = field(default_factory=lambda: iter(()))


def attempt(
    d: Directory,
    model: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    stream: bool,
    t0: float,
    tries: int = ATTEMPTS,
    wait: Wait | None = None,
) -> Answered | str:
    """The replica that answered, or why none did: the last failure ("" when no replica was there to try and the
    caller cannot wait)."""
    tried: set[str] = set()
    failure, queue_s = "", 0.0
    while len(tried) < tries:
        target = d.pick(model, tried, path=path)
        if target is None:
            if wait is None:
                return failure
            target, waited = wait(model, tried, path)
            queue_s += waited
        answered = _send(d, target, path, body, headers, stream)
        if not isinstance(answered, str):
            answered.attempts, answered.queue_s = len(tried) + 1, queue_s
            return answered
        failure = answered
        d.done(target, Outcome(0, time.monotonic() - t0, queue_s), failed=True)
        tried.add(target.replica_id)
    return failure


def _send(
    d: Directory, target: Target, path: str, body: bytes, headers: dict[str, str], stream: bool
) -> Answered | str:
    """One try at one replica: its answer, or why it failed before its first byte (its URL is not the caller's to
    know)."""
    replica = f"replica {target.replica_id[:8]}"
    try:
        resp = forward(d, target, path, body, headers, stream)
    except urllib3.exceptions.HTTPError as exc:
        return f"{replica}: {type(exc).__name__}"
    if (
        resp.status >= 500 or resp.status == 401
    ):  # 401: the replica's key is not the one we hold (a successor)
        resp.release_conn()
        return f"{replica}: HTTP {resp.status}" if resp.status >= 500 else f"{replica}: no first byte"
    if not stream:
        return Answered(target, resp, 1)
    started = _first_chunk(resp)
    if started is None:
        return f"{replica}: no first byte"
    return Answered(target, resp, 1, first=started[1], rest=started[0])


def forward(
    d: Directory, target: Target, path: str, body: bytes, headers: dict[str, str], stream: bool
) -> Any:
    """Send one request to a replica over the table's connections; the urllib3 response (not read yet when
    `stream`)."""
    return d.http.request(
        "POST",
        target.url.rstrip("/") + path,
        body=body,
        headers={**headers, **target.headers},
        preload_content=not stream,
        timeout=urllib3.Timeout(connect=2.0, read=target.timeout_s),
    )


def _first_chunk(resp: Any) -> tuple[Iterator[bytes], bytes] | None:
    """A stream's first bytes, read before anything is sent to the client (None: the replica failed first)."""
    chunks = resp.stream(8192, decode_content=False)
    try:
        first = next(chunks, b"")
    except (urllib3.exceptions.HTTPError, OSError):
        first = b""
    if not first:
        resp.release_conn()
        return None
    return chunks, first
