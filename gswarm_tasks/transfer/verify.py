"""Verification that follows a pull: each file is hashed in block order as soon as its blocks are on disk."""

from __future__ import annotations

import mmap
import threading
from pathlib import Path
from typing import Any

import blake3

from ..devices import file_path
from ..errors import VerificationError
from ..storage import HASH_BLOCK, check_file
from .ledger import Ledger


def _blocks(size: int) -> int:
    return (size + HASH_BLOCK - 1) // HASH_BLOCK


def _hash_blocks(path: Path, size: int, rel: str, ledger: Ledger, hasher: Any) -> bool:
    """Hash a file block by block as each lands; False if the transfer failed first."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for block, off in enumerate(range(0, size, HASH_BLOCK)):
                if not ledger.wait_for(rel, block):
                    return False
                hasher.update(view[off : off + HASH_BLOCK])
        finally:
            view.release()
    return True


def _verify_one(dest: Path, entry: dict[str, Any], ledger: Ledger) -> tuple[bool, BaseException | None]:
    """(finished, error) for one manifest entry; not finished when the transfer failed first."""
    rel, size = entry["path"], int(entry["size"])
    path = file_path(dest, rel)
    if entry.get("blocks") is not None:  # every block was checked as it arrived
        return all(ledger.wait_for(rel, b) for b in range(_blocks(size))), None
    if "blake3" not in entry:  # an old manifest: check the finished file by sha256
        if not all(ledger.wait_for(rel, b) for b in range(_blocks(size))):
            return False, None
        try:
            check_file(path, entry, rel)
        except VerificationError as exc:
            return True, exc
        return True, None
    hasher = blake3.blake3()
    if size and not _hash_blocks(path, size, rel, ledger, hasher):
        return False, None
    got = hasher.hexdigest()
    if got == entry["blake3"]:
        return True, None
    return True, VerificationError(
        f"{rel}: blake3 mismatch (expected {entry['blake3'][:16]}..., got {got[:16]}...)",
        {"file": rel, "algorithm": "blake3", "expected": entry["blake3"], "actual": got},
    )


class Verifier:
    """A thread that verifies a pull's files as their blocks land; `verdict[rel]` holds each file's outcome."""

    def __init__(self, dest: Path, manifest: dict[str, Any], ledger: Ledger) -> None:
        self.dest, self.manifest, self.ledger = dest, manifest, ledger
        self.verdict: dict[str, BaseException | None] = {}
        self.thread = threading.Thread(target=self._run, daemon=True, name="gswarm-verify")

    def _run(self) -> None:
        for entry in self.manifest["files"]:
            finished, error = _verify_one(self.dest, entry, self.ledger)
            if not finished:
                return
            self.verdict[entry["path"]] = error

    def start(self) -> Verifier:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join()
