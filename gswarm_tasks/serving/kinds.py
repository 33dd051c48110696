"""What a model directory holds (GGUF files, an embedding model, a causal LM), and what follows from it: the engine
`auto` chooses, the file a preset that takes one file is given, and the flags an engine needs for that kind of model
(vLLM's runner, llama.cpp's embeddings)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import ResourceUnavailable
from .engines import AUTO

GGUF, EMBEDDINGS, COMPLETIONS, UNKNOWN = "gguf", "embeddings", "completions", "unknown"
# llama.cpp's encoder architectures: a GGUF of these embeds (`--embeddings`), it does not generate.
GGUF_ENCODERS = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "jina-bert-v2",
        "jina-bert-v3",
        "modern-bert",
        "neo-bert",
        "t5encoder",
    }
)
GPU_LLM_ENGINES = ("vllm", "sglang", "tgi")  # `auto`'s order for a causal LM on a GPU


def gguf_file(model_dir: Path) -> Path | None:
    """The model's GGUF weights file (the largest, when there are several: the others are adapters or parts)."""
    files = sorted(model_dir.glob("*.gguf"), key=lambda p: p.stat().st_size, reverse=True)
    return files[0] if files else None


def model_kind(model_dir: Path) -> str:
    """What a model directory holds: `gguf` (llama.cpp's files), `embeddings` (a sentence-transformers model or an
    encoder), `completions` (a causal LM) or `unknown`."""
    if gguf_file(model_dir) is not None:
        return GGUF
    if any(
        (model_dir / marker).is_file() for marker in ("modules.json", "config_sentence_transformers.json")
    ):
        return EMBEDDINGS
    try:
        archs = json.loads((model_dir / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return UNKNOWN
    if any(str(a).endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in archs):
        return COMPLETIONS
    return EMBEDDINGS if archs else UNKNOWN


# GGUF's metadata value types (gguf.GGUFValueType): sizes of the fixed ones; 8 is a string, 9 an array.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_MAX_KEYS = 64  # general.architecture comes first in every file llama.cpp's tools write


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated")
    return data


def _skip(f: BinaryIO, vtype: int) -> None:
    if vtype in _FIXED:
        f.seek(_FIXED[vtype], 1)
    elif vtype == 8:
        (n,) = struct.unpack("<Q", _read(f, 8))
        f.seek(n, 1)
    elif vtype == 9:
        etype, count = struct.unpack("<IQ", _read(f, 12))
        for _ in range(count if etype == 8 else 0):
            _skip(f, 8)
        if etype != 8:
            f.seek(_FIXED[etype] * count, 1)
    else:
        raise ValueError(f"value type {vtype}")


def gguf_architecture(path: Path) -> str | None:
    """`general.architecture` of a GGUF file (version 2 or 3), read from its header; None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            if _read(f, 4) != b"GGUF" or struct.unpack("<I", _read(f, 4))[0] < 2:
                return None
            _tensors, keys = struct.unpack("<QQ", _read(f, 16))
            for _ in range(min(keys, _MAX_KEYS)):
                (n,) = struct.unpack("<Q", _read(f, 8))
                key = _read(f, min(n, 1 << 16)).decode(errors="replace")
                (vtype,) = struct.unpack("<I", _read(f, 4))
                if key == "general.architecture" and vtype == 8:
                    (n,) = struct.unpack("<Q", _read(f, 8))
                    return _read(f, min(n, 256)).decode(errors="replace")
                _skip(f, vtype)
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return None


def resolve_auto(kind: str, on_gpu: bool, installed: Callable[[str], bool]) -> str:
    """The preset `auto` means for a model of `kind` on a GPU or a CPU, among the engines `installed` on the node:
    GGUF files -> llama.cpp; a causal LM on a GPU -> vLLM, else SGLang, else TGI; everything else -> builtin."""
    if kind == GGUF:
        if installed("llama.cpp"):
            return "llama.cpp"
        raise ResourceUnavailable("engine auto: the model is GGUF files and llama.cpp's llama-server is not installed",
                                  {"engine": AUTO})  # fmt: skip
    if kind == COMPLETIONS and on_gpu:
        return next((e for e in GPU_LLM_ENGINES if installed(e)), "builtin")
    return "builtin"


def preset_flags(engine: str, model_dir: Path, on_gpu: bool, params: Mapping[str, Any]) -> list[str]:
    """The flags an engine needs for this model beyond its template: vLLM's runner (pooling for an embedding model,
    generate for a causal LM, unless `runner` is given) and, on a CPU, float32 unless `dtype` is given (the CPU
    build would halve an embedding model's precision); llama.cpp's embeddings for an encoder GGUF."""
    if engine == "vllm":
        kind = model_kind(model_dir)
        runner = {EMBEDDINGS: "pooling", COMPLETIONS: "generate"}.get(kind)
        flags = ["--runner", runner] if runner and "runner" not in params else []
        return flags + ([] if on_gpu or "dtype" in params else ["--dtype", "float32"])
    if engine == "llama.cpp":
        found = gguf_file(model_dir)
        if found is not None and gguf_architecture(found) in GGUF_ENCODERS:
            return ["--embeddings", "--pooling", "mean"]
    return []
