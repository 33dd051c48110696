"""gswarm's built-in model server: one model from a local directory behind an OpenAI-style HTTP API.

It loads the model, then binds the port (so "the port answers GET /health" means ready) and prints
`gswarm-model-server ready on http://HOST:PORT`. ML libraries are imported inside functions only; the Hugging
Face hub is never contacted. Start-up failures print `gswarm-model-server: CODE: message` and exit 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from ..errors import GswarmError, InvalidRequest, ModelNotFound, NotFound, ResourceUnavailable, error_body
from .backend import COMPLETE, EMBED, Backend, check_device, detect_task, embed, load_backend
from .engines import KEY_HEADER
from .generation import chat_prompt, complete, events, params_of, stream_text
from .inflight import Active
from .inputs import MAX_BODY_BYTES, bounded, strings
from .keepalive import IDLE_S, accepted
from .keepalive import make_server as keep_alive_server
from .keys import read_key_file, require_key

log = logging.getLogger("gswarm.model_server")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _request_id() -> str:
    if "request_id" not in g:
        given = request.headers.get("X-Request-ID", "")
        g.request_id = given if _REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex[:20]}"
    return str(g.request_id)


def _error(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> tuple[Response, int]:
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
            message = (
                f"/v1/{task} is not served: model {self.name!r} is loaded for the {self.backend.task} task"
            )
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
            raise InvalidRequest(
                "'encoding_format' must be 'float' or 'base64'", {"field": "encoding_format"}
            )
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
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
        }
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
    p = argparse.ArgumentParser(
        prog="python -m gswarm_tasks.serving.model_server", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model-path", required=True, type=Path, help="local model directory")
    p.add_argument("--model-name", required=True, help="the name clients use in 'model'")
    p.add_argument("--port", required=True, type=int, help="TCP port; 0 picks a free one")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    p.add_argument("--task", default="auto", choices=["auto", EMBED, COMPLETE])
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--max-batch-size", type=int, default=64, help="most inputs/prompts per request")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads of a forward pass (0: torch's default)"
    )
    p.add_argument(
        "--keep-alive-s", type=float, default=IDLE_S, help="idle keep-alive connections close after it"
    )
    p.add_argument(
        "--key-file", type=Path, help=f"file holding the key every request must send in {KEY_HEADER}"
    )
    args = p.parse_args(argv)
    if (
        args.max_batch_size < 1
        or not 0 <= args.port <= 65535
        or args.threads < 0
        or not args.keep_alive_s > 0
    ):
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
