"""Helpers of the race tests: real HTTP calls to a fleet's API (`Fleet.serve_http`), and several released at once."""

from __future__ import annotations

import threading
from typing import Any

import requests

from tests.harness.fleet import Fleet


def call(fleet: Fleet, method: str, path: str, **kw: Any) -> requests.Response:
    """One request to the fleet's API over HTTP (`fleet.base_url`), with its admin token."""
    url = f"{fleet.base_url}/api/v1{path}"  # type: ignore[attr-defined]
    return requests.request(method, url, headers={"Authorization": f"Bearer {fleet.token}"}, timeout=30, **kw)


def at_once(*calls: Any) -> list[requests.Response]:
    """Fire the calls from threads released together by a barrier; their answers, in order."""
    gate = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def run(i: int, fn: Any) -> None:
        gate.wait()
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out
