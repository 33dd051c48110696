"""Text generation for the built-in model server: completions and chat, whole or streamed as OpenAI's
server-sent events (`data: {...}` lines, then `data: [DONE]`). ML libraries are imported inside functions only."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidRequest

MAX_TOKENS_LIMIT = 4096
ROLES = ("system", "user", "assistant", "tool")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _number(
    body: dict[str, Any], key: str, default: float, lo: float, hi: float, *, integer: bool = False
) -> Any:
    value = default if body.get(key) is None else body[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int if integer else (int, float))
        or not lo <= value <= hi
    ):
        kind = "an integer" if integer else "a number"
        raise InvalidRequest(f"'{key}' must be {kind} in [{lo}, {hi}]", {"field": key, "value": value})
    return value


def params_of(body: dict[str, Any]) -> dict[str, Any]:
    """Sampling parameters of a completion or chat request (checked)."""
    if body.get("n", 1) != 1:
        raise InvalidRequest("only 'n': 1 is supported", {"field": "n"})
    stop = _as_list(body.get("stop") or [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise InvalidRequest(
            "'stop' must be a string or a list of at most 4 non-empty strings", {"field": "stop"}
        )
    return {
        "max_tokens": _number(body, "max_tokens", 16, 1, MAX_TOKENS_LIMIT, integer=True),
        "temperature": float(_number(body, "temperature", 1.0, 0.0, 2.0)),
        "top_p": float(_number(body, "top_p", 1.0, 1e-6, 1.0)),
        "stop": stop,
        "stream": bool(body.get("stream")),
    }


def chat_prompt(tokenizer: Any, messages: Any) -> str:
    """The prompt of a chat: the model's chat template, else `role: content` lines and `assistant:`."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", {"field": "messages"})
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidRequest(
                f"'messages[{i}]' must be {{role: {'|'.join(ROLES)}, content: string}}",
                {"field": f"messages[{i}]"},
            )
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"


def _encode(backend: Any, prompt: str, params: dict[str, Any]) -> tuple[Any, int, dict[str, Any]]:
    tok, model = backend.tokenizer, backend.model
    enc = tok(prompt, return_tensors="pt").to(model.device)
    n_prompt = int(enc["input_ids"].shape[1])
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    if limit and n_prompt + params["max_tokens"] > limit:
        details = {"prompt_tokens": n_prompt, "max_tokens": params["max_tokens"], "context_length": limit}
        raise InvalidRequest(
            f"prompt ({n_prompt} tokens) + max_tokens exceeds the context length {limit}", details
        )
    sample = params["temperature"] > 0
    gen: dict[str, Any] = {"max_new_tokens": params["max_tokens"], "do_sample": sample}
    if sample:
        gen.update(temperature=params["temperature"], top_p=params["top_p"], top_k=0)
    gen["pad_token_id"] = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return enc, n_prompt, gen


def _finish(backend: Any, text: str, new: list[int], params: dict[str, Any]) -> tuple[str, str]:
    tok, model = backend.tokenizer, backend.model
    eos_ids = {tok.eos_token_id, *_as_list(getattr(model.generation_config, "eos_token_id", None))} - {None}
    finish = "stop" if new and new[-1] in eos_ids else "length"
    cuts = [i for i in (text.find(s) for s in params["stop"]) if i >= 0]
    if cuts:
        text, finish = text[: min(cuts)], "stop"
    return text, finish


def complete(backend: Any, prompt: str, params: dict[str, Any]) -> tuple[str, str, int, int]:
    """One prompt -> (text, finish_reason, prompt_tokens, completion_tokens)."""
    import torch

    enc, n_prompt, gen = _encode(backend, prompt, params)

    def forward() -> Any:
        with torch.inference_mode():
            return backend.model.generate(**enc, **gen)

    out = backend.run(forward)
    new = out[0, n_prompt:].tolist()
    text, finish = _finish(backend, backend.tokenizer.decode(new, skip_special_tokens=True), new, params)
    return text, finish, n_prompt, len(new)


def stream_text(backend: Any, prompt: str, params: dict[str, Any]) -> Iterator[str]:
    """The completion of one prompt, piece by piece as the model makes it (stop strings end it early)."""
    import torch
    from transformers import TextIteratorStreamer

    enc, _, gen = _encode(backend, prompt, params)
    streamer = TextIteratorStreamer(
        backend.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=600
    )

    def run() -> None:
        try:
            with torch.inference_mode():
                backend.model.generate(**enc, **gen, streamer=streamer)
        except Exception:
            streamer.end()  # the reader must not wait for pieces that will never come
            raise

    backend.start(run)
    sent = ""
    for piece in streamer:
        cuts = [i for i in ((sent + piece).find(s) for s in params["stop"]) if i >= 0]
        if cuts:
            if min(cuts) > len(sent):
                yield (sent + piece)[len(sent) : min(cuts)]
            for _ in streamer:  # let generation end; nothing more is sent
                pass
            return
        sent += piece
        if piece:
            yield piece


def events(name: str, kind: str, pieces: Iterator[str]) -> Iterator[str]:
    """Server-sent events of a streamed completion (`kind` text_completion) or chat (`chat.completion`)."""
    head = {
        "id": f"{'chatcmpl' if kind != 'text_completion' else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
    }
    obj = "chat.completion.chunk" if kind != "text_completion" else "text_completion"

    def chunk(delta: str | None, finish: str | None) -> str:
        if kind == "text_completion":
            choice: dict[str, Any] = {
                "index": 0,
                "text": delta or "",
                "finish_reason": finish,
                "logprobs": None,
            }
        else:
            choice = {
                "index": 0,
                "delta": {"content": delta} if delta is not None else {},
                "finish_reason": finish,
            }
        return "data: " + json.dumps({**head, "object": obj, "model": name, "choices": [choice]}) + "\n\n"

    if kind != "text_completion":
        yield (
            "data: "
            + json.dumps(
                {
                    **head,
                    "object": obj,
                    "model": name,
                    "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                }
            )
            + "\n\n"
        )
    for piece in pieces:
        yield chunk(piece, None)
    yield chunk(None, "stop")
    yield "data: [DONE]\n\n"
