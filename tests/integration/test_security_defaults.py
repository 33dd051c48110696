"""Secure defaults with real processes: a node worker refuses what another user planted at its default dram root (a
symlink, a directory of someone else's or one open to all) and makes the root private itself otherwise; Flower
started with FLOWER_BASIC_AUTH answers 401 without it; compose's Redis command line refuses a client without the
password."""

from __future__ import annotations

import base64
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import yaml

from gswarm_web.cli.up import free_port
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import ROOT, Proc, wait_for

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part

OTHER_UID = 54321  # another user of the host, owner of what is planted


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("security"), nodes=()) as f:
        yield f


@pytest.fixture
def node() -> Iterator[str]:
    """A node name of this test alone: its default dram root is /dev/shm/gswarm-<uid>/<name>."""
    name = f"plant-{uuid.uuid4().hex[:8]}"
    yield name
    _remove(default_dram_root(name))


def default_dram_root(node: str) -> Path:
    return Path("/dev/shm") / f"gswarm-{os.geteuid()}" / node


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def create_on_dram(fleet: Fleet, node: str, text: str) -> dict[str, Any]:
    """POST /data of a small chunk to NODE:dram: the failed task's error, or the chunk once available."""
    body = {"data": base64.b64encode(text.encode()).decode(), "device": f"{node}:dram", "format": "bytes"}
    code, resp = fleet.post("/data", {**body, "type": "input"})
    if code >= 400:
        return dict(resp["error"])
    if resp.get("task_id"):
        task = fleet.wait_task(resp["task_id"])
        if task["status"] == "failed":
            return dict(task["error"])
    return dict(fleet.get(f"/data/{resp['chunk_id']}")[1])


def test_a_node_refuses_what_another_user_planted_at_its_default_dram_root(fleet: Fleet, node: str) -> None:
    assert os.geteuid() == 0, "this test makes files of another user: run it as root (as `make test` does)"
    root = default_dram_root(node)
    root.parent.mkdir(mode=0o700, exist_ok=True)  # this user's own directory, as a node makes it
    bait = Path(tempfile.mkdtemp(prefix="gswarm-bait-"))
    os.chmod(bait, 0o777)
    try:
        root.symlink_to(bait)  # planted before the node ever ran
        proc = fleet.start_node(node, GSWARM_DRAM_ROOT="")  # the default root
        wait_for(lambda: "is a symbolic link" in proc.log(), 10, "the worker to log the refused dram root")
        err = create_on_dram(fleet, node, "through the symlink")
        assert err["code"] == "RESOURCE_UNAVAILABLE" and "is a symbolic link" in err["message"], err
        assert list(bait.iterdir()) == []  # nothing written through it

        root.unlink()
        root.mkdir(mode=0o700)
        os.chown(root, OTHER_UID, OTHER_UID)  # a directory of someone else's at the node's path
        err = create_on_dram(fleet, node, "into another user's directory")
        assert err["code"] == "RESOURCE_UNAVAILABLE" and f"belongs to uid {OTHER_UID}" in err["message"], err
        assert list(root.iterdir()) == []

        os.chown(root, os.geteuid(), os.getegid())
        os.chmod(root, 0o777)  # ours, but open to everyone: not repaired, refused
        err = create_on_dram(fleet, node, "into an open directory")
        assert err["code"] == "RESOURCE_UNAVAILABLE" and "(0777)" in err["message"], err

        root.rmdir()
        chunk = create_on_dram(fleet, node, "private")
        assert chunk["status"] == "available", chunk
        for d in (root.parent, root):
            st = d.lstat()
            assert (st.st_uid, oct(st.st_mode & 0o7777)) == (os.geteuid(), "0o700"), d
        assert (root / "data" / chunk["chunk_id"]).read_text() == "private"
    finally:
        fleet.procs.pop(node).stop()
        shutil.rmtree(bait, ignore_errors=True)


def test_flower_answers_401_without_its_basic_auth(fleet: Fleet) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "gswarm_tasks",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
    ]
    flower = Proc(
        "flower", argv, {**fleet.env, "FLOWER_BASIC_AUTH": "ops:flower-secret"}, fleet.tmp / "logs"
    ).start()
    url = f"http://127.0.0.1:{port}/api/workers"
    try:
        status = wait_for(lambda: requests.get(url, timeout=2).status_code, 60, "Flower up")
        assert status == 401
        assert requests.get(url, auth=("ops", "wrong"), timeout=5).status_code == 401
        assert requests.get(url, auth=("ops", "flower-secret"), timeout=5).status_code == 200
    finally:
        flower.stop()


def test_composes_redis_command_refuses_a_client_without_the_password(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    argv = [str(a) for a in doc["services"]["redis"]["command"]]
    password = "0123456789abcdef0123456789abcdef"
    argv = [a.replace(a, password) if a.startswith("${GSWARM_REDIS_PASSWORD:?") else a for a in argv]
    assert argv[-2:] == ["--requirepass", password], argv
    port = free_port()
    argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    server = Proc("compose-redis", argv, dict(os.environ), tmp_path).start()
    try:
        wait_for(lambda: redis.Redis(port=port, password=password, socket_timeout=1).ping(), 15, "redis up")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, socket_timeout=5).ping()
        assert redis.Redis(port=port, password=password, socket_timeout=5).ping()
    finally:
        server.stop()
