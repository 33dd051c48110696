"""A trace generator in the original's formats: a config (models, workflows) and requests at a target utilisation.

Arrivals are Poisson, or bursty (bursts of geometric size at Poisson times, the same mean rate), at the rate that
keeps `utilization` of the GPUs busy with execution alone: rate = utilization x GPUs / mean GPU-seconds per request.
Execution times are drawn as the original drew them: tokens ~ N(token_mean, token_std) / tokens_per_second for
language models, N(inference_time_mean, inference_time_std) for the others.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


def _llm(memory: float, gpus: int, load: float, tps: float, tokens: float) -> dict[str, Any]:
    return {
        "type": "llm",
        "memory_gb": memory,
        "gpus_required": gpus,
        "load_time_seconds": load,
        "tokens_per_second": tps,
        "token_mean": tokens,
        "token_std": tokens / 4,
    }


def _fixed(kind: str, memory: float, load: float, seconds: float) -> dict[str, Any]:
    return {
        "type": kind,
        "memory_gb": memory,
        "gpus_required": 1,
        "load_time_seconds": load,
        "inference_time_mean": seconds,
        "inference_time_std": seconds / 4,
    }


def _wf(name: str, nodes: list[tuple[str, str]], edges: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "name": name,
        "nodes": [{"id": i, "model": m, "inputs": [], "outputs": []} for i, m in nodes],
        "edges": [{"from": a, "to": b} for a, b in edges],
    }


def bench_config() -> dict[str, Any]:
    """Eight models (one needing two GPUs) and five workflow shapes: chain, diamond, fan-out, 2-GPU, short chain.

    Loads take seconds to tens of seconds and steps about as long, so where a step runs decides how much of the
    fleet goes to loading: the regime the original scheduler was written for.
    """
    models = {
        "llama_8b": _llm(16, 1, 10, 50, 512),
        "qwen_7b": _llm(15, 1, 10, 50, 400),
        "coder_13b": _llm(26, 2, 20, 35, 512),
        "sdxl": _fixed("image_generation", 12, 8, 6.0),
        "sd15": _fixed("image_generation", 8, 6, 3.0),
        "whisper": _fixed("audio_transcription", 6, 4, 3.0),
        "clip": _fixed("embedding", 4, 3, 0.5),
        "reranker": _fixed("embedding", 2, 2, 1.0),
    }
    workflows = {
        "transcribe_illustrate": _wf(
            "chain",
            [("asr", "whisper"), ("summary", "llama_8b"), ("image", "sdxl")],
            [("asr", "summary"), ("summary", "image")],
        ),
        "code_review": _wf(
            "diamond",
            [("plan", "qwen_7b"), ("deep", "coder_13b"), ("style", "llama_8b"), ("report", "qwen_7b")],
            [("plan", "deep"), ("plan", "style"), ("deep", "report"), ("style", "report")],
        ),
        "image_variants": _wf(
            "fan-out",
            [("prompt", "llama_8b"), ("v1", "sd15"), ("v2", "sd15"), ("hq", "sdxl"), ("embed", "clip")],
            [("prompt", "v1"), ("prompt", "v2"), ("prompt", "hq"), ("prompt", "embed")],
        ),
        "deep_analysis": _wf(
            "2-GPU", [("analyse", "coder_13b"), ("explain", "llama_8b")], [("analyse", "explain")]
        ),
        "rag": _wf(
            "short chain",
            [("embed", "clip"), ("rerank", "reranker"), ("answer", "qwen_7b")],
            [("embed", "rerank"), ("rerank", "answer")],
        ),
    }
    return {"models": models, "workflows": workflows}


def _mean_seconds(model: dict[str, Any]) -> float:
    if model.get("tokens_per_second") and model.get("token_mean"):
        return float(model["token_mean"]) / float(model["tokens_per_second"])
    return float(model.get("inference_time_mean") or 1.0)


def _draw_seconds(model: dict[str, Any], rng: random.Random) -> float:
    if model.get("tokens_per_second") and model.get("token_mean"):
        tokens = max(1, int(rng.gauss(model["token_mean"], model.get("token_std") or 0)))
        return round(tokens / model["tokens_per_second"], 3)
    mean = float(model.get("inference_time_mean") or 1.0)
    return round(max(0.1 * mean, rng.gauss(mean, model.get("inference_time_std") or 0)), 3)


def request_work(config: dict[str, Any], workflow_id: str) -> float:
    """Mean GPU-seconds of execution one request of a workflow needs."""
    models = config["models"]
    return sum(
        _mean_seconds(models[n["model"]]) * int(models[n["model"]].get("gpus_required", 1))
        for n in config["workflows"][workflow_id]["nodes"]
    )


def _arrivals(count: int, rate: float, burst: float, rng: random.Random) -> list[float]:
    times: list[float] = []
    t = 0.0
    while len(times) < count:
        t += rng.expovariate(rate / burst)
        size = 1 if burst <= 1 else min(count - len(times), 1 + int(rng.expovariate(1 / (burst - 1))))
        times.extend([t] * size)
    return times[:count]


def generate(
    config: dict[str, Any],
    *,
    requests: int,
    gpus: int,
    utilization: float,
    seed: int = 0,
    burst: float = 1.0,
    workflows: list[str] | None = None,
) -> dict[str, Any]:
    """A `{"requests": [...]}` trace: workflows drawn uniformly from `workflows` (all by default), arrivals at the
    rate that fills `utilization` of `gpus`, in bursts of mean size `burst` (1 = plain Poisson)."""
    rng = random.Random(seed)
    names = list(workflows or config["workflows"])
    mean_work = sum(request_work(config, w) for w in names) / len(names)
    rate = utilization * gpus / mean_work
    out = []
    for i, at in enumerate(_arrivals(requests, rate, burst, rng)):
        wid = rng.choice(names)
        nodes = config["workflows"][wid]["nodes"]
        out.append(
            {
                "request_id": f"req_{i:05d}",
                "timestamp": (EPOCH + timedelta(seconds=at)).isoformat(),
                "workflow_id": wid,
                "input_data": {"user_prompt": f"request {i}"},
                "node_configs": {},
                "node_execution_times": {
                    n["id"]: _draw_seconds(config["models"][n["model"]], rng) for n in nodes
                },
            }
        )
    return {"requests": out}
