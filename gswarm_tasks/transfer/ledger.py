"""Which blocks of which files a pull has on disk, saved beside the partial files so an interrupted copy resumes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class Ledger:
    """Blocks on disk per file; the verifier waits on it for each block to land."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        try:
            self.done: dict[str, list[int]] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.done = {}
        self.arrived = threading.Condition(self.lock)
        self.failed = False

    def has(self, rel: str, block: int) -> bool:
        return block in self.done.get(rel, ())

    def mark(self, rel: str, block: int) -> None:
        with self.lock:
            self.done.setdefault(rel, []).append(block)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.done))
            os.replace(tmp, self.path)
            self.arrived.notify_all()

    def wait_for(self, rel: str, block: int) -> bool:
        """Block until `block` of `rel` is on disk; False when the transfer failed instead."""
        with self.lock:
            while block not in self.done.get(rel, ()) and not self.failed:
                self.arrived.wait(1.0)
            return not self.failed

    def fail(self) -> None:
        with self.lock:
            self.failed = True
            self.arrived.notify_all()

    def forget(self, rel: str) -> None:
        with self.lock:
            self.done.pop(rel, None)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
