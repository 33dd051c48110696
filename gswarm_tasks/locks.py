"""Exclusive device leases in Redis: two steps that need `node1:gpu0` never run at once.

A lease expires unless renewed, so a worker killed while holding one frees the device within seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from . import names
from .errors import Cancelled, LeaseBusy

_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)


@contextmanager
def device_leases(
    client: redis.Redis,
    devices: list[str],
    owner: str,
    lease_s: float = 10.0,
    poll_s: float = 0.05,
    cancelled: Callable[[], bool] | None = None,
    wait: bool = True,
) -> Iterator[None]:
    """Hold every device in `devices` (taken in sorted order, so two steps cannot deadlock)."""
    held: list[str] = []
    stop = threading.Event()
    try:
        for dev in sorted(set(devices)):
            key = names.device_lock_key(dev)
            while not client.set(key, owner, nx=True, px=int(lease_s * 1000)):
                if client.get(key) == owner.encode():  # our own lease from an earlier delivery
                    break
                if not wait:
                    raise LeaseBusy(dev)
                if cancelled is not None and cancelled():
                    raise Cancelled(f"cancelled while waiting for {dev}")
                time.sleep(poll_s)
            held.append(key)
        if held:

            def renew() -> None:
                while not stop.wait(lease_s / 3):
                    for key in held:
                        try:
                            client.eval(_RENEW, 1, key, owner, int(lease_s * 1000))
                        except redis.RedisError:
                            pass

            threading.Thread(target=renew, daemon=True, name="gswarm-lease").start()
        yield
    finally:
        stop.set()
        for key in held:
            try:
                client.eval(_RELEASE, 1, key, owner)
            except redis.RedisError:
                pass
