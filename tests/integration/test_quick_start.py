"""The original's Quick Start on real processes: `gswarm host start` with the original's flags and config.yaml (its
embedded broker on --port, the API on --http-port and again on --model-port), `host status` / `host stop`, nodes that
join with `gswarm client connect` (HOST:PORT from the config with --token, and a redis:// URL), a bare tier meaning
the node this host runs, the config's declared nodes `missing` until they join, `node status`, the status words."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gswarm_web.cli.up import free_port
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part

GSWARM = str(Path(sys.executable).with_name("gswarm"))


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GSWARM, *args], env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def dram_base() -> Iterator[Path]:
    base = Path("/dev/shm") / f"gswarm-test-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_quick_start_as_written(tmp_path: Path, dram_base: Path) -> None:
    bport, hport, mport = free_port(), free_port(), free_port()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "cluster": {"host": "127.0.0.1", "port": bport, "http_port": hport, "model_port": mport,
                    "heartbeat_interval": 0.5},
        "queue": {"max_concurrent_tasks": 2},
        "nodes": [{"name": n, "address": "127.0.0.1", "capabilities": {"gpus": [], "storage": {"dram": "1GB"}}}
                  for n in ("nodea", "nodeb", "nodec")],
    }))  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("GSWARM_")}
    base.update(GSWARM_CONFIG=str(cfg), PYTHONUNBUFFERED="1")
    head_env = {**base, "GSWARM_HOME": str(tmp_path / "head")}
    procs: list[Proc] = []
    try:
        # the original's first line; the ports come from its config.yaml (cluster.port, http_port, model_port)
        head = Proc("host", [GSWARM, "host", "start"], head_env, tmp_path / "logs").start()
        procs.append(head)
        head.wait_log("Press Ctrl-C to stop.", timeout=90)
        password = (tmp_path / "head" / "redis.password").read_text().strip()
        pw_file = tmp_path / "head" / "redis.password"
        assert f'join        gswarm client connect 127.0.0.1:{bport} --token "$(cat {pw_file})"' in head.log()
        assert password not in head.log()
        for port in (hport, mport):  # the model API is the same API on the original's model port
            assert (
                requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=5).json()["status"]
                == "healthy"
            )
        status = run(head_env, "host", "status")
        assert status.returncode == 0 and f"http://127.0.0.1:{mport}" in status.stdout, status
        again = run(head_env, "host", "start")
        assert again.returncode == 1 and "already running" in again.stderr, again

        token = (tmp_path / "head" / "token").read_text().strip()
        node_envs = {}
        for node in ("nodea", "nodeb"):
            node_envs[node] = {**base, "GSWARM_HOME": str(tmp_path / node), "GSWARM_TOKEN": token,
                               "GSWARM_DRAM_ROOT": str(dram_base / node)}  # fmt: skip
        # without the broker's password: one line saying where it is
        refused = run(node_envs["nodea"], "client", "connect", "--resilient", "--node", "nodea")
        assert (
            refused.returncode == 1 and "needs its password" in refused.stderr and "--token" in refused.stderr
        )
        assert "Traceback" not in refused.stderr
        # as the Quick Start types it (the host from config.yaml's cluster.host:cluster.port), and by URL
        argv_a = [GSWARM, "client", "connect", "--resilient", "--node", "nodea", "--token", password]
        argv_b = [GSWARM, "client", "connect", f"redis://:{password}@127.0.0.1:{bport}/0", "--node", "nodeb"]
        for node, argv in (("nodea", argv_a), ("nodeb", argv_b)):
            procs.append(Proc(f"client-{node}", argv, node_envs[node], tmp_path / "logs").start())

        def fleet() -> dict[str, str] | None:
            r = run(head_env, "nodes", "--json")
            got = {n["name"]: n["status"] for n in json.loads(r.stdout)["nodes"]} if r.returncode == 0 else {}
            return got if got.get("nodea") == got.get("nodeb") == "healthy" else None

        assert wait_for(fleet, 60, "nodea and nodeb to join") == {"nodea": "healthy", "nodeb": "healthy",
                                                                  "nodec": "missing"}  # fmt: skip
        _bare_tiers_mean_this_node(head_env, node_envs)
        _node_status_and_status_words(head_env, node_envs)

        stop = run(head_env, "host", "stop")
        assert stop.returncode == 0 and "stopped" in stop.stdout, stop
        assert head.proc is not None and head.proc.wait(timeout=10) == 0
        assert run(head_env, "host", "status").returncode == 1
    finally:
        for p in reversed(procs):
            p.stop()


def _chunk(env: dict[str, str], *args: str) -> dict[str, Any]:
    r = run(env, "data", "create", "--data-b64", "aGVsbG8=", *args, "--json")
    assert r.returncode == 0, r
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _bare_tiers_mean_this_node(head_env: dict[str, str], node_envs: dict[str, dict[str, str]]) -> None:
    """`--device dram` on a host that runs a node is that node's dram; on the head (no node) placement chooses."""
    for node, env in node_envs.items():
        chunk = _chunk(env, "--device", "dram", "--metadata", json.dumps({"from": node}))
        assert [loc["device"] for loc in chunk["locations"]] == [f"{node}:dram"], chunk
    anywhere = _chunk(head_env, "--device", "dram", "--metadata", json.dumps({"from": "head"}))
    assert [loc["device"].split(":")[1] for loc in anywhere["locations"]] == ["dram"], anywhere


def _node_status_and_status_words(head_env: dict[str, str], node_envs: dict[str, dict[str, str]]) -> None:
    r = run(node_envs["nodeb"], "node", "status")  # no name: this host's node
    assert r.returncode == 0 and "nodeb healthy" in r.stdout and "declared" in r.stdout, r
    r = run(head_env, "node", "status", "nodec")
    assert r.returncode == 1 and "nodec missing" in r.stdout and "never (not joined yet)" in r.stdout, r
    r = run(head_env, "queue", "tasks", "--status", "completed")
    assert r.returncode == 0 and r.stdout.count("succeeded") >= 3, r
    r = run(head_env, "queue", "tasks", "--status", "pending")
    assert r.returncode == 0 and "succeeded" not in r.stdout, r
    r = run(head_env, "model", "service-health", "llama-7b")
    assert r.returncode == 1 and "no live service of llama-7b" in r.stderr, r
