"""A file source is checked on the file that was opened: links inside an allowed root that point out of it, and a
link swapped in for a checked path, read nothing outside the roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gswarm_tasks.devices import open_under
from gswarm_tasks.errors import InvalidRequest, NotFound


def test_only_files_under_the_roots_are_opened(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    (root / "ok.bin").write_bytes(b"fine")
    (outside / "key").write_bytes(b"private")
    with open_under(root / "ok.bin", [str(root)]) as f:
        assert f.read() == b"fine"
    (root / "link").symlink_to(outside / "key")  # a link in the root that points out of it
    with pytest.raises(InvalidRequest, match="not a file under an allowed root"):
        open_under(root / "link", [str(root)])
    (root / "inside").symlink_to(root / "ok.bin")  # one that stays inside (a cache's snapshot and its blob)
    with open_under(root / "inside", [str(root)]) as f:
        assert f.read() == b"fine"
    (root / "dir").symlink_to(
        outside, target_is_directory=True
    )  # a directory swapped for a link after a check
    with pytest.raises(InvalidRequest, match="not a file under an allowed root"):
        open_under(root / "dir" / "key", [str(root)])
    with pytest.raises(InvalidRequest, match="not a file under an allowed root"):
        open_under(root, [str(root)])  # a directory is not a file
    with pytest.raises(NotFound):
        open_under(root / "missing", [str(root)])
    assert not [
        fd
        for fd in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(outside / "key")
    ]
