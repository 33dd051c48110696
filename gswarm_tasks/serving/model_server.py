"""gswarm's built-in model server: one model from a local directory behind an OpenAI-style HTTP API.

It loads the model, then binds the port (so "the port answers GET /health" means ready) and prints
`gswarm-model-server ready on http://HOST:PORT`. ML libraries are imported inside functions only; the Hugging
Face hub is never contacted. Start-up failures print `gswarm-model-server: CODE: message` and exit 3.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from ..errors import GswarmError, InvalidRequest, ModelNotFound, NotFound, ResourceUnavailable, error_body
from .engines import KEY_HEADER
from .generation import chat_prompt, complete, events, params_of, stream_text
from .inflight import Active
from .inputs import MAX_BODY_BYTES, bounded, strings
from .keepalive import IDLE_S, accepted
from .keepalive import make_server as keep_alive_server
from .keys import read_key_file, require_key

log = logging.getLogger("gswarm.model_server")
T = TypeVar("T")
EMBED, COMPLETE = "embeddings", "completions"
_DEVICE_RE = re.compile(r"^(cpu|cuda(?::(\d+))?)$")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ST_MARKERS = ("modules.json", "config_sentence_transformers.json")


@dataclass
class Backend:
    """The loaded model. Every forward pass runs on one thread of its own (`run`): passes are serialised, and torch
    keeps one pool of intra-op threads. Called from each request's thread instead, every new thread would start a
    pool of its own, and many spinning pools on a few cores cut throughput by half or more under concurrency.
    Embedding requests that arrive while a pass runs wait in `waiting` and go through the next pass together."""

    task: str
    model: Any
    tokenizer: Any = None
    forward: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="gswarm-forward")
    )
    waiting: list[tuple[list[str], Future[tuple[Any, list[int]]]]] = field(default_factory=list)
    waiting_lock: threading.Lock = field(default_factory=threading.Lock)
    passes: int = 0  # embedding passes run (requests_total / passes: how well requests were batched)

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` (a forward pass) on the backend's own thread and wait for its result."""
        return self.forward.submit(fn).result()

    def start(self, fn: Callable[[], None]) -> None:
        """Queue `fn` on the backend's thread without waiting (a streamed generation)."""
        self.forward.submit(fn)


def check_device(device: str) -> str:
    """Return the canonical device name or raise; CUDA that the host lacks is refused, never faked."""
    m = _DEVICE_RE.match(device)
    if not m:
        raise InvalidRequest(f"bad device {device!r}: expected cpu or cuda:N", {"device": device})
    if m.group(1) == "cpu":
        return "cpu"
    name = f"cuda:{int(m.group(2) or 0)}"
    import torch

    if not torch.cuda.is_available() or int(m.group(2) or 0) >= torch.cuda.device_count():
        raise ResourceUnavailable(f"{name} is not available on this host", {"device": name})
    return name


def detect_task(path: Path) -> str:
    if any((path / marker).is_file() for marker in _ST_MARKERS):
        return EMBED
    try:
        archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot detect the task of {path}: no readable config.json ({exc})") from None
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return COMPLETE
    hint = "pass --task embeddings (mean pooling) or --task completions"
    raise InvalidRequest(f"cannot detect the task of {path} (architectures {archs}); {hint}", {"architectures": archs})


def load_backend(path: Path, task: str, device: str, trust_remote_code: bool) -> Backend:
    if task == EMBED:
        from sentence_transformers import SentenceTransformer

        # A plain transformers encoder (no modules.json) gets mean pooling from sentence-transformers itself.
        st = SentenceTransformer(str(path), device=device, trust_remote_code=trust_remote_code, local_files_only=True)
        st.eval()
        return Backend(EMBED, st)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    opts: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(path), **opts)
    dtype = torch.float32 if device == "cpu" else "auto"
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **opts)
    model = model.to(device).eval()
    return Backend(COMPLETE, model, tokenizer)


def embed(backend: Backend, texts: list[str], fmt: str, batch: int) -> tuple[list[Any], int]:
    """Vectors and token count of `texts`. Requests that wait together are encoded in one pass (dynamic
    batching, at most `batch` texts a pass); each gets its own rows back."""
    import numpy as np

    done: Future[tuple[Any, list[int]]] = Future()
    with backend.waiting_lock:
        backend.waiting.append((texts, done))
        if len(backend.waiting) == 1:  # the first to wait schedules the pass that takes everyone waiting then
            backend.start(lambda: _encode_waiting(backend, batch))
    vectors, tokens = done.result()
    vectors = np.asarray(vectors, dtype="<f4")
    if fmt == "base64":
        return [base64.b64encode(v.tobytes()).decode("ascii") for v in vectors], sum(tokens)
    return [v.tolist() for v in vectors], sum(tokens)


def _encode_waiting(backend: Backend, batch: int) -> None:
    """On the forward thread: encode the waiting requests (up to `batch` texts, the first always) in one pass."""
    import torch

    with backend.waiting_lock:
        taken: list[tuple[list[str], Future[tuple[Any, list[int]]]]] = []
        count = 0
        while backend.waiting and (not taken or count + len(backend.waiting[0][0]) <= batch):
            taken.append(backend.waiting.pop(0))
            count += len(taken[-1][0])
        if backend.waiting:  # the rest go in the next pass
            backend.start(lambda: _encode_waiting(backend, batch))
    texts = [t for request_texts, _ in taken for t in request_texts]
    backend.passes += 1
    try:
        with torch.inference_mode():
            mask = backend.model.preprocess(texts)["attention_mask"]
            vectors = backend.model.encode(texts, batch_size=batch, convert_to_numpy=True, show_progress_bar=False)
        tokens = [int(n) for n in mask.sum(dim=1)]
    except Exception as exc:
        for _, fut in taken:
            fut.set_exception(exc)
        return
    start = 0
    for request_texts, fut in taken:
        end = start + len(request_texts)
        fut.set_result((vectors[start:end], tokens[start:end]))
        start = end


def _request_id() -> str:
    if "request_id" not in g:
        given = request.headers.get("X-Request-ID", "")
        g.request_id = given if _REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex[:20]}"
    return str(g.request_id)


def _error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> tuple[Response, int]:
    return jsonify(error_body(code, message, details, _request_id())), status


def _on_error(exc: Exception) -> tuple[Response, int]:
    """Every error in the shape of the control plane's API."""
    if isinstance(exc, GswarmError):
        return _error(exc.status, exc.code, exc.message, exc.details)
    if isinstance(exc, HTTPException) and (exc.code or 500) < 500:
        code = "NOT_FOUND" if exc.code == 404 else "INVALID_REQUEST"
        message, details = str(exc.description or exc.name), {}
        if exc.code == 404:
            message = f"no such resource: {request.path}"
        elif exc.code == 405:
            message = f"method {request.method} is not allowed on {request.path}"
            details = {"allowed_methods": sorted(getattr(exc, "valid_methods", None) or [])}
        return _error(exc.code or 400, code, message, details)
    log.exception("unhandled error on %s %s [%s]", request.method, request.path, _request_id())
    return _error(500, "INTERNAL", "internal error; see the model server log")


class _Server:
    """The model's endpoints: what a request may ask of the loaded backend."""

    def __init__(self, backend: Backend, name: str, device: str, max_batch: int) -> None:
        self.backend, self.name, self.device, self.max_batch = backend, name, device, max_batch
        self.started = time.monotonic()
        self.requests_total = 0
        self.lock = threading.Lock()

    def count(self) -> None:  # every request but the health probes
        if request.path != "/health":
            with self.lock:
                self.requests_total += 1

    def json_body(self) -> dict[str, Any]:
        body = request.get_json(force=True, silent=True)
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.name:
            raise ModelNotFound(
                f"model {model!r} is not served here; this server serves {self.name!r}", {"model": model}
            )
        return body

    def only(self, task: str) -> None:
        if self.backend.task != task:
            message = f"/v1/{task} is not served: model {self.name!r} is loaded for the {self.backend.task} task"
            raise NotFound(message, {"task": self.backend.task, "endpoint": f"/v1/{task}"})

    def health(self) -> Response:
        uptime = round(time.monotonic() - self.started, 3)
        return jsonify(
            status="ok", model=self.name, task=self.backend.task, device=self.device, uptime_s=uptime,
            requests_total=self.requests_total, embedding_passes=self.backend.passes, pid=os.getpid(),
            connections_total=accepted(),
        )  # fmt: skip

    def models(self) -> Response:
        return jsonify(object="list", data=[{"id": self.name, "object": "model", "owned_by": "gswarm"}])

    def embeddings(self) -> Response:
        self.only(EMBED)
        body = self.json_body()
        texts = strings(body, "input", self.max_batch)
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise InvalidRequest("'encoding_format' must be 'float' or 'base64'", {"field": "encoding_format"})
        vectors, tokens = embed(self.backend, texts, fmt, self.max_batch)
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return jsonify(object="list", data=data, model=self.name, usage=usage)

    def completions(self) -> Response:
        self.only(COMPLETE)
        body = self.json_body()
        prompts = strings(body, "prompt", self.max_batch)
        params = params_of(body)
        if params["stream"]:
            if len(prompts) != 1:
                raise InvalidRequest("'stream' takes one prompt", {"field": "prompt"})
            pieces = stream_text(self.backend, prompts[0], params)
            return Response(events(self.name, "text_completion", pieces), mimetype="text/event-stream")
        choices, n_prompt, n_done = [], 0, 0
        for i, prompt in enumerate(prompts):
            text, finish, p, c = complete(self.backend, prompt, params)
            choices.append({"index": i, "text": text, "finish_reason": finish, "logprobs": None})
            n_prompt, n_done = n_prompt + p, n_done + c
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_done, "total_tokens": n_prompt + n_done}
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
        return jsonify({**head, "model": self.name, "choices": choices, "usage": usage})

    def chat(self) -> Response:
        self.only(COMPLETE)
        body = self.json_body()
        params = params_of(body)
        messages = body.get("messages")
        if isinstance(messages, list):
            bounded([str(m.get("content", "")) for m in messages if isinstance(m, dict)], "messages")
        prompt = chat_prompt(self.backend.tokenizer, messages)
        if params["stream"]:
            pieces = stream_text(self.backend, prompt, params)
            return Response(events(self.name, "chat.completion", pieces), mimetype="text/event-stream")
        text, finish, n_prompt, n_done = complete(self.backend, prompt, params)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_done, "total_tokens": n_prompt + n_done}
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time())}
        return jsonify({**head, "model": self.name, "choices": [choice], "usage": usage})


DRAIN_S = 12.0  # on SIGTERM, requests in flight get this long (the node sends SIGKILL after 15 s)


def create_app(backend: Backend, name: str, device: str, max_batch: int, key: str | None = None) -> Flask:
    app = Flask("gswarm_model_server")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    server = _Server(backend, name, device, max_batch)
    app.before_request(require_key(key))
    app.before_request(server.count)

    @app.after_request
    def _tag(resp: Response) -> Response:
        resp.headers["X-Request-ID"] = _request_id()
        return resp

    app.register_error_handler(Exception, _on_error)
    app.add_url_rule("/health", "health", server.health, methods=["GET"])
    app.add_url_rule("/v1/models", "models", server.models, methods=["GET"])
    app.add_url_rule("/v1/embeddings", "embeddings", server.embeddings, methods=["POST"])
    app.add_url_rule("/v1/completions", "completions", server.completions, methods=["POST"])
    app.add_url_rule("/v1/chat/completions", "chat", server.chat, methods=["POST"])
    return app


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gswarm_tasks.serving.model_server", description=__doc__.split("\n")[0])
    p.add_argument("--model-path", required=True, type=Path, help="local model directory")
    p.add_argument("--model-name", required=True, help="the name clients use in 'model'")
    p.add_argument("--port", required=True, type=int, help="TCP port; 0 picks a free one")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    p.add_argument("--task", default="auto", choices=["auto", EMBED, COMPLETE])
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--max-batch-size", type=int, default=64, help="most inputs/prompts per request")
    p.add_argument("--threads", type=int, default=0, help="torch threads of a forward pass (0: torch's default)")
    p.add_argument("--keep-alive-s", type=float, default=IDLE_S, help="idle keep-alive connections close after it")
    p.add_argument("--key-file", type=Path, help=f"file holding the key every request must send in {KEY_HEADER}")
    args = p.parse_args(argv)
    if args.max_batch_size < 1 or not 0 <= args.port <= 65535 or args.threads < 0 or not args.keep_alive_s > 0:
        p.error("--max-batch-size must be >= 1, --port in [0, 65535], --threads >= 0 and --keep-alive-s > 0")
    return args


def _fail(exc: GswarmError | str) -> int:
    text = f"{exc.code}: {exc.message}" if isinstance(exc, GswarmError) else str(exc)
    print(f"gswarm-model-server: {text}", file=sys.stderr, flush=True)
    return 3


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # OpenMP's threads sleep between passes instead of spinning: several servers (and the node worker) share a
    # host's cores, and spinning threads took ten times the CPU of the passes themselves (bench/gateway.py).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in (log.name, "werkzeug"):
        logging.getLogger(name).setLevel(logging.INFO)
    server: Any = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if server is None:  # still loading: nothing to drain
            raise SystemExit(0)
        server.stopping = True  # keep-alive connections close after their current response
        threading.Thread(target=server.shutdown, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    path = args.model_path.resolve()
    try:
        key = read_key_file(args.key_file)
        if not path.is_dir():
            raise ModelNotFound(f"model directory {path} does not exist", {"model_path": str(path)})
        device = check_device(args.device)
        task = detect_task(path) if args.task == "auto" else args.task
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        t0 = time.monotonic()
        backend = load_backend(path, task, device, args.trust_remote_code)
        log.info("loaded %s (%s) on %s in %.1f s", args.model_name, task, device, time.monotonic() - t0)
    except GswarmError as exc:
        return _fail(exc)
    except Exception as exc:  # a broken model directory, a missing library, out of memory...
        return _fail(f"INTERNAL: cannot load {path} as {args.task}: {type(exc).__name__}: {exc}")
    app = create_app(backend, args.model_name, device, args.max_batch_size, key)
    active = Active(app.wsgi_app)
    app.wsgi_app = active  # type: ignore[method-assign]
    try:
        server = keep_alive_server(args.host, args.port, app, args.keep_alive_s)
    except OSError as exc:
        return _fail(ResourceUnavailable(f"cannot bind {args.host}:{args.port}: {exc}", {"port": args.port}))
    print(f"gswarm-model-server ready on http://{args.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()  # no new connection; the requests being answered finish first
        if not active.wait_idle(DRAIN_S):
            log.warning("stopped with requests still in flight after %.0f s", DRAIN_S)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
