"""Requests a model server is answering, counted until each response's last byte (a stream included), so that a
stop lets them finish: the server stops accepting, then waits for the count to reach zero."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Active:
    """WSGI middleware: how many requests are being answered (a stream until its last byte), so a stop can wait."""

    def __init__(self, app: Any) -> None:
        self.app, self.count, self.lock = app, 0, threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        with self.lock:
            self.count += 1
        try:
            body = self.app(environ, start_response)
        except BaseException:
            self.leave()
            raise
        return _Closing(body, self.leave)

    def leave(self) -> None:
        with self.lock:
            self.count -= 1

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if self.count <= 0:
                    return True
            time.sleep(0.05)
        return False


class _Closing:
    def __init__(self, body: Any, done: Callable[[], None]) -> None:
        self.body, self.done, self.closed = body, done, False

    def __iter__(self) -> Any:
        return iter(self.body)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if hasattr(self.body, "close"):
                self.body.close()
        finally:
            self.done()
