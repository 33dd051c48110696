"""Exclusive leases in Redis: two steps that need `node1:gpu0` never run at once, and two operations never write
one model's copy on one node at once (a copy, a move, a download and a delete of `node1:disk`'s copy take turns).

A lease expires unless renewed, so a worker killed while holding one frees it within seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import redis

from . import names
from .errors import Cancelled, LeaseBusy

_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
    "else return 0 end"
)


def device_leases(
    client: redis.Redis,
    devices: list[str],
    owner: str,
    lease_s: float = 10.0,
    poll_s: float = 0.05,
    cancelled: Callable[[], bool] | None = None,
    wait: bool = True,
) -> AbstractContextManager[None]:
    """Hold every device in `devices` (taken in sorted order, so two steps cannot deadlock)."""
    keys = {names.device_lock_key(dev): dev for dev in devices}
    return leases(client, keys, owner, lease_s, poll_s, cancelled, wait)


def model_leases(
    client: redis.Redis, node: str, tiers: list[str], model: str, owner: str, wait: bool = True
) -> AbstractContextManager[None]:
    """Hold `model`'s copies on these tiers of `node` while an operation writes or removes them."""
    keys = {names.model_lock_key(node, tier, model): f"{model} on {node}:{tier}" for tier in tiers}
    return leases(client, keys, owner, wait=wait, poll_s=0.1)


@contextmanager
def leases(
    client: redis.Redis,
    keys: dict[str, str],
    owner: str,
    lease_s: float = 10.0,
    poll_s: float = 0.05,
    cancelled: Callable[[], bool] | None = None,
    wait: bool = True,
) -> Iterator[None]:
    """Hold every key of `keys` (key -> what it guards, for LeaseBusy), taken in sorted order so that two holders
    cannot deadlock; renewed while held."""
    held: list[str] = []
    stop = threading.Event()
    try:
        for key in sorted(keys):
            while not client.set(key, owner, nx=True, px=int(lease_s * 1000)):
                if client.get(key) == owner.encode():  # our own lease from an earlier delivery
                    break
                if not wait:
                    raise LeaseBusy(keys[key])
                if cancelled is not None and cancelled():
                    raise Cancelled(f"cancelled while waiting for {keys[key]}")
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
