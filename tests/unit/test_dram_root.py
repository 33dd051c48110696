"""The dram tier's root is a directory private to the node's user: made 0700, and a symlink, a directory of another
user or one open to others at its place is refused with RESOURCE_UNAVAILABLE (and nothing is written through it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gswarm_tasks.context import NodeContext, NodeTiers, private_dir
from gswarm_tasks.errors import ResourceUnavailable
from gswarm_tasks.serving.replicas import ServiceRegistry
from tests.harness.app import make_settings

OTHER_UID = 54321


def sticky_anchor(tmp_path: Path) -> Path:
    """A stand-in for /dev/shm: writable by all, sticky."""
    anchor = tmp_path / "shm"
    anchor.mkdir()
    os.chmod(anchor, 0o1777)
    return anchor


def refused(path: Path, anchor: Path) -> ResourceUnavailable:
    with pytest.raises(ResourceUnavailable) as exc:
        private_dir(path, anchor, "n1:dram")
    assert exc.value.code == "RESOURCE_UNAVAILABLE"
    assert exc.value.details["device"] == "n1:dram"
    return exc.value


def test_the_default_root_is_per_user_under_dev_shm(home: Path) -> None:
    s = make_settings(home)
    assert s.effective_dram_root("n1") == Path("/dev/shm") / f"gswarm-{os.geteuid()}" / "n1"
    assert s.effective_dram_anchor() == Path("/dev/shm")
    configured = make_settings(home, GSWARM_DRAM_ROOT=str(home / "ram" / "dram"))
    assert configured.effective_dram_root("n1") == home / "ram" / "dram"
    assert configured.effective_dram_anchor() == home / "ram"


def test_made_0700_and_used_again(tmp_path: Path) -> None:
    anchor = sticky_anchor(tmp_path)
    root = anchor / "gswarm-u" / "n1"
    old = os.umask(0)  # a permissive umask changes nothing
    try:
        assert private_dir(root, anchor, "n1:dram") == root
    finally:
        os.umask(old)
    for d in (root, root.parent):
        st = os.lstat(d)
        assert oct(st.st_mode & 0o777) == "0o700" and st.st_uid == os.geteuid()
    (root / "kept").write_text("x")
    assert private_dir(root, anchor, "n1:dram") == root and (root / "kept").read_text() == "x"


def test_a_planted_symlink_is_refused_and_nothing_goes_through_it(tmp_path: Path) -> None:
    anchor = sticky_anchor(tmp_path)
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    (anchor / "gswarm-u").symlink_to(elsewhere)
    err = refused(anchor / "gswarm-u" / "n1", anchor)
    assert "symbolic link" in err.message and err.details["refused"] == str(anchor / "gswarm-u")
    assert list(elsewhere.iterdir()) == []
    # A symlink as the last part too.
    (anchor / "gswarm-v").mkdir(mode=0o700)
    (anchor / "gswarm-v" / "n1").symlink_to(elsewhere)
    assert "symbolic link" in refused(anchor / "gswarm-v" / "n1", anchor).message


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    assert os.geteuid() == 0, (
        "this test makes a directory of another user: run it as root (as `make test` does)"
    )
    anchor = sticky_anchor(tmp_path)
    foreign = anchor / "gswarm-u"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, OTHER_UID, OTHER_UID)
    err = refused(foreign / "n1", anchor)
    assert f"belongs to uid {OTHER_UID}" in err.message
    assert not (foreign / "n1").exists()


def test_a_directory_open_to_others_is_refused_not_repaired(tmp_path: Path) -> None:
    anchor = sticky_anchor(tmp_path)
    open_dir = anchor / "gswarm-u"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    assert "(0755)" in refused(open_dir / "n1", anchor).message
    assert oct(open_dir.stat().st_mode & 0o777) == "0o755"


def test_a_world_writable_anchor_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    anchor = tmp_path / "shm"
    anchor.mkdir()
    os.chmod(anchor, 0o777)
    assert "not sticky" in refused(anchor / "gswarm-u" / "n1", anchor).message
    assert refused(tmp_path / "missing" / "x", tmp_path / "missing").message.endswith(
        f"no tmpfs at {tmp_path}/missing"
    )


def test_node_tiers_check_on_every_use(tmp_path: Path, home: Path) -> None:
    ram = sticky_anchor(tmp_path)
    s = make_settings(home, GSWARM_DRAM_ROOT=str(ram / "n1"))
    node = NodeContext.create(s, "n1", "n1@host", "127.0.0.1", ServiceRegistry)
    assert isinstance(node.tiers, NodeTiers) and node.storage_root.is_dir()
    assert node.tiers.chunk_path("dram", "c1").parent == ram / "n1" / "data"
    assert node.dram_available() and oct((ram / "n1").stat().st_mode & 0o777) == "0o700"
    # Replaced after start-up by a symlink: refused at the next use.
    (ram / "n1").rmdir()
    (ram / "n1").symlink_to(tmp_path)
    assert not node.dram_available()
    with pytest.raises(ResourceUnavailable, match="symbolic link"):
        node.tiers.model_dir("dram", "m")
    assert node.tiers.root("disk") == node.storage_root
