"""The model a built-in server holds: loaded once from a local directory (sentence-transformers for embeddings,
transformers for a causal LM), on a device the host has; its forward passes on one thread of its own, and embedding
requests that wait together encoded in one pass."""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import InvalidRequest, ResourceUnavailable

T = TypeVar("T")
EMBED, COMPLETE = "embeddings", "completions"
_DEVICE_RE = re.compile(r"^(cpu|cuda(?::(\d+))?)$")
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
    raise InvalidRequest(
        f"cannot detect the task of {path} (architectures {archs}); {hint}", {"architectures": archs}
    )


def load_backend(path: Path, task: str, device: str, trust_remote_code: bool) -> Backend:
    if task == EMBED:
        from sentence_transformers import SentenceTransformer

        # A plain transformers encoder (no modules.json) gets mean pooling from sentence-transformers itself.
        st = SentenceTransformer(
            str(path), device=device, trust_remote_code=trust_remote_code, local_files_only=True
        )
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
            vectors = backend.model.encode(
                texts, batch_size=batch, convert_to_numpy=True, show_progress_bar=False
            )
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
