"""One settings object: defaults, then `config.yaml`, then `GSWARM_*` environment variables."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config_keys import check_keys, parse_nodes
from .devices import validate_node_name
from .errors import ConfigError
from .serving.engines import parse_engines

# Defaults where neither the config file nor the environment says otherwise.
API_HOST = "127.0.0.1"
API_PORT = 8091
REDIS_URL = "redis://127.0.0.1:6379/0"
HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TIMEOUT_S = 30.0
OFFLINE_AFTER_S = 120.0
TASK_TIMEOUT_S = 3600
VISIBILITY_TIMEOUT_S = 12 * 3600
RETRY_COUNT = 3
TASK_EVENTS = False
MAX_CONCURRENT_TASKS = 4
PROFILING_FREQUENCY_MS = 1000
DATA_INLINE_MAX_BYTES = 64 * 1024
DATA_BATCH_MAX_COUNT = 1000

ADMIN_TOKEN_MIN_CHARS = 32  # an admin token runs anything on the fleet: long enough that guessing is hopeless
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}


def parse_size(value: Any) -> int:
    """Bytes from an int or a string like `100GB` or `64GiB`."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int | float):
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r}")
    unit = (m.group(2) or "").lower()
    binary = "i" in unit
    prefix = unit[:1] if unit[:1] in "kmgtp" and unit else ""
    mult = _SIZE_UNITS[prefix]
    if binary and prefix:
        mult = 1024 ** ("kmgtp".index(prefix) + 1)
    return int(float(m.group(1)) * mult)


def parse_engine_paths(value: Any) -> dict[str, str]:
    """`serving.engine_paths`: preset -> a directory (JSON in GSWARM_SERVE_ENGINE_PATHS)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ValueError(f"not a JSON mapping: {exc}") from None
    pairs = value.items() if isinstance(value, dict) else []
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in pairs
    ):
        raise ValueError("a mapping of preset name -> directory (whose bin/ holds the engine's programs)")
    return {k: str(Path(v).expanduser()) for k, v in value.items()}


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _default_node_name() -> str:
    host = socket.gethostname().split(".")[0].lower()
    name = re.sub(r"[^a-z0-9-]", "-", host).strip("-")[:63] or "node"
    return name if name[0].isalnum() else f"n{name}"[:63]


@dataclass(frozen=True)
class Option:
    """One setting: its attribute, environment variable, place in config.yaml, parser and help."""

    name: str
    env: str
    path: str | None
    parse: Callable[[Any], Any]
    help: str


def _paths(v: Any) -> tuple[str, ...]:
    items = v if isinstance(v, list | tuple) else str(v).split(os.pathsep)
    return tuple(str(Path(str(p)).expanduser().resolve()) for p in items if str(p).strip())


def _hosts(v: Any) -> tuple[str, ...]:
    items = v if isinstance(v, list | tuple) else str(v).split(",")
    return tuple(str(h).strip().lower() for h in items if str(h).strip())


def _opt_str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def _output_format(v: Any) -> str:
    if str(v) not in ("gswarm", "original"):
        raise ValueError(f"{v!r}: gswarm or original")
    return str(v)


def _budget(v: Any) -> float:
    """A share of memory (`50%`) as a fraction, else a size in bytes."""
    text = str(v).strip()
    if text.endswith("%"):
        share = float(text[:-1]) / 100
        if not 0 <= share <= 1:
            raise ValueError(f"{v!r}: a share from 0% to 100%")
        return share
    size = float(parse_size(v))
    if size != 0 and size <= 1:
        raise ValueError(f"{v!r}: bytes (more than 1), or a share such as 50%")
    return size


def _removed_serve_command(v: Any) -> None:
    raise ValueError(
        "serving.command (GSWARM_SERVE_COMMAND) was removed: name the command as a preset under "
        'serving.engines (e.g. `serving: {engines: {mine: "vllm serve {path} --port {port}"}}`)'
    )


OPTIONS: tuple[Option, ...] = (
    Option(
        "home", "GSWARM_HOME", None, str, "State directory: database, token, logs, local storage (~/.gswarm)"
    ),
    Option("config_file", "GSWARM_CONFIG", None, _opt_str, "Config file (default $GSWARM_HOME/config.yaml)"),
    Option(
        "database_url",
        "GSWARM_DATABASE_URL",
        "cluster.database_url",
        _opt_str,
        "SQLAlchemy URL of the state database (default SQLite in $GSWARM_HOME)",
    ),
    Option(
        "redis_url",
        "GSWARM_REDIS_URL",
        "cluster.redis_url",
        _opt_str,
        "Redis URL: broker, results, streams (`gswarm up` embeds one when unset)",
    ),
    Option(
        "api_host",
        "GSWARM_API_HOST",
        "cluster.host",
        str,
        "The host's address: the API and `gswarm host start`'s broker bind to it, the CLI calls it, `gswarm client"
        " connect` without an address joins it (127.0.0.1)",
    ),
    Option(
        "broker_port",
        "GSWARM_BROKER_PORT",
        "cluster.port",
        int,
        "Port nodes join at (the original's 8090): `gswarm host start` puts its embedded Redis there and `gswarm"
        " client connect HOST` connects there (8090)",
    ),
    Option("api_port", "GSWARM_API_PORT", "cluster.http_port", int, "Port of the API and dashboard (8091)"),
    Option(
        "model_port",
        "GSWARM_MODEL_API_PORT",
        "cluster.model_port",
        int,
        "A second port of the same API, for clients of the original's model API (9010; 0: none)",
    ),
    Option(
        "join_token",
        "GSWARM_JOIN_TOKEN",
        "cluster.join_token",
        _opt_str,
        "The broker's credential `gswarm client connect HOST:PORT` joins with: the host's $GSWARM_HOME/redis.password",
    ),
    Option(
        "api_url",
        "GSWARM_API_URL",
        "cluster.api_url",
        _opt_str,
        "API the CLI talks to (http://127.0.0.1:8091)",
    ),
    Option(
        "token", "GSWARM_TOKEN", None, _opt_str, "Bearer token the CLI sends (default: $GSWARM_HOME/token)"
    ),
    Option(
        "api_body_timeout_s",
        "GSWARM_API_BODY_TIMEOUT",
        "api.body_timeout_s",
        float,
        "Seconds a request's body has to arrive, plus one per MiB of it (10); later it gets 408. The token is "
        "checked before the body is read",
    ),
    Option(
        "admin_token",
        "GSWARM_ADMIN_TOKEN",
        "auth.admin_token",
        _opt_str,
        "A fixed admin token the API accepts besides the ones in its database (for clusters; at least 32 characters)",
    ),
    Option(
        "node_name",
        "GSWARM_NODE_NAME",
        None,
        _opt_str,
        "This host's node name; its queue has the same name (default: from the worker name or hostname)",
    ),
    Option(
        "node_address",
        "GSWARM_NODE_ADDRESS",
        None,
        _opt_str,
        "Address other nodes reach this one at (default: the address that routes to the broker)",
    ),
    Option(
        "storage_root",
        "GSWARM_STORAGE_ROOT",
        "models.storage_path",
        _opt_str,
        "Node storage root, the `disk` tier (default $GSWARM_HOME/storage/<node>)",
    ),
    Option(
        "dram_root",
        "GSWARM_DRAM_ROOT",
        "models.dram_path",
        _opt_str,
        "tmpfs directory of the `dram` tier, private to the node's user (default /dev/shm/gswarm-<uid>/<node>)",
    ),
    Option(
        "cache_size",
        "GSWARM_MODELS_CACHE_SIZE",
        "models.cache_size",
        parse_size,
        "Bytes the models on a node's disk tier may take together (`100GB` style accepted; 0: no limit); a download, "
        "copy or move that would pass it fails with RESOURCE_UNAVAILABLE and keeps nothing (0)",
    ),
    Option(
        "heartbeat_interval_s",
        "GSWARM_HEARTBEAT_INTERVAL",
        "cluster.heartbeat_interval",
        float,
        "Seconds between node heartbeats (5)",
    ),
    Option(
        "heartbeat_timeout_s",
        "GSWARM_HEARTBEAT_TIMEOUT",
        "cluster.heartbeat_timeout",
        float,
        "Seconds without a heartbeat before a node is `unhealthy` (30)",
    ),
    Option(
        "offline_after_s",
        "GSWARM_OFFLINE_AFTER",
        "cluster.offline_after",
        float,
        "Seconds without a heartbeat before a node is `offline` (120)",
    ),
    Option(
        "max_concurrent_tasks",
        "GSWARM_QUEUE_MAX_CONCURRENT_TASKS",
        "queue.max_concurrent_tasks",
        int,
        "Tasks a node worker runs at once (4)",
    ),
    Option(
        "task_timeout_s",
        "GSWARM_QUEUE_TASK_TIMEOUT",
        "queue.task_timeout",
        int,
        "Hard time limit of any task in seconds (3600)",
    ),
    Option(
        "retry_count",
        "GSWARM_QUEUE_RETRY_COUNT",
        "queue.retry_count",
        int,
        "Retries of a failed task, and redeliveries of one whose worker died (3)",
    ),
    Option(
        "task_events",
        "GSWARM_QUEUE_TASK_EVENTS",
        "queue.task_events",
        parse_bool,
        "Celery task events from the start (task-sent by senders, the rest by workers); Flower turns the workers'"
        " on by itself (false)",
    ),
    Option(
        "visibility_timeout_s",
        "GSWARM_QUEUE_VISIBILITY_TIMEOUT",
        "queue.visibility_timeout",
        int,
        "Seconds before Redis redelivers an unacknowledged task; must exceed the task timeout (43200)",
    ),
    Option(
        "profiling_frequency_ms",
        "GSWARM_PROFILING_DEFAULT_FREQUENCY",
        "profiling.default_frequency",
        int,
        "Default sampling period of a profiling session in ms (1000)",
    ),
    Option(
        "profiling_bandwidth",
        "GSWARM_PROFILING_ENABLE_BANDWIDTH",
        "profiling.enable_bandwidth",
        parse_bool,
        "Record PCIe bandwidth by default (true)",
    ),
    Option(
        "profiling_nvlink",
        "GSWARM_PROFILING_ENABLE_NVLINK",
        "profiling.enable_nvlink",
        parse_bool,
        "Record NVLink bandwidth by default (false)",
    ),
    Option(
        "profiling_spill_max_bytes",
        "GSWARM_PROFILING_SPILL_MAX_BYTES",
        "profiling.spill_max_bytes",
        parse_size,
        "Bytes of frames a node keeps on disk while Redis is unreachable; past it frames are dropped, counted (64MB)",
    ),
    Option(
        "placement_memory_overhead",
        "GSWARM_PLACEMENT_MEMORY_OVERHEAD",
        "placement.memory_overhead",
        float,
        "GPU memory a served model needs, as a multiple of its weights' bytes (1.2)",
    ),
    Option(
        "allowed_roots",
        "GSWARM_MODELS_ALLOWED_ROOTS",
        "models.allowed_roots",
        _paths,
        "Directories `file://` model and data sources may come from (os.pathsep-separated; none by default)",
    ),
    Option(
        "allow_remote_code",
        "GSWARM_MODELS_ALLOW_REMOTE_CODE",
        "models.allow_remote_code",
        parse_bool,
        "Whether this node serves models registered with trust_remote_code: it runs the model directory's own Python"
        " code, as the node's user (false: such a serve is refused here)",
    ),
    Option(
        "file_host",
        "GSWARM_FILE_HOST",
        "transfer.host",
        _opt_str,
        "Address a node's file server binds to (default: the node's address)",
    ),
    Option(
        "file_port",
        "GSWARM_FILE_PORT",
        "transfer.port",
        int,
        "Port of a node's file server (0: a free port, announced in the heartbeat)",
    ),
    Option(
        "transfer_secret",
        "GSWARM_TRANSFER_SECRET",
        "transfer.secret",
        _opt_str,
        "Key that signs node-to-node transfer tokens (default: generated once and kept in Redis)",
    ),
    Option(
        "transfer_token_ttl_s",
        "GSWARM_TRANSFER_TOKEN_TTL",
        "transfer.token_ttl",
        int,
        "Seconds a transfer token stays valid (900)",
    ),
    Option(
        "transfer_streams",
        "GSWARM_TRANSFER_STREAMS",
        "transfer.streams",
        int,
        "Parallel range requests of one node-to-node copy (4)",
    ),
    Option(
        "serve_port_start",
        "GSWARM_SERVE_PORT_START",
        "serving.port_start",
        int,
        "First port tried for a model service without one (8080)",
    ),
    Option(
        "serve_ready_timeout_s",
        "GSWARM_SERVE_READY_TIMEOUT",
        "serving.ready_timeout",
        float,
        "Seconds a model service may take to answer /health (300)",
    ),
    Option(
        "serve_check_interval_s",
        "GSWARM_SERVE_CHECK_INTERVAL",
        "serving.check_interval",
        float,
        "Seconds between health checks of running services (10)",
    ),
    Option(
        "serve_cpu_threads",
        "GSWARM_SERVE_CPU_THREADS",
        "serving.cpu_threads",
        int,
        "Threads of one built-in model server's forward passes (1; 0: torch's default, every core)",
    ),
    Option(
        "serve_engines",
        "GSWARM_SERVE_ENGINES",
        "serving.engines",
        parse_engines,
        "This node's serving presets besides the defaults (builtin, vllm, sglang, tgi, llama.cpp): name -> command "
        "line with {path} {host} {port} {model} {python}, or a mapping (command, params, health_path, key_env, "
        "routes); JSON in the environment",
    ),
    Option(
        "serve_engine_paths",
        "GSWARM_SERVE_ENGINE_PATHS",
        "serving.engine_paths",
        parse_engine_paths,
        "Where this node's engines live: preset -> a directory whose bin/ holds the engine's programs (a virtual "
        'environment, an unpacked package), e.g. {"vllm": "/opt/vllm", "llama.cpp": "/opt/llama.cpp"}; an engine '
        "not named here is looked for on the PATH; JSON in the environment",
    ),
    Option(
        "serve_command",
        "GSWARM_SERVE_COMMAND",
        "serving.command",
        _removed_serve_command,
        "Removed: a command is a named preset in serving.engines; setting this is an error",
    ),
    Option(
        "serve_cold_start_waiters",
        "GSWARM_SERVE_COLD_START_WAITERS",
        "serving.cold_start_waiters",
        int,
        "Gateway requests one web process lets wait on cold starts at once (16; fewer than its threads under a "
        "threaded server); the rest get 503 with Retry-After",
    ),
    Option(
        "serve_scale_up_delay_s",
        "GSWARM_SERVE_SCALE_UP_DELAY",
        "serving.scale_up_delay",
        float,
        "Seconds an autoscaled service's load must stay above its target before replicas are added (2)",
    ),
    Option(
        "serve_scale_down_delay_s",
        "GSWARM_SERVE_SCALE_DOWN_DELAY",
        "serving.scale_down_delay",
        float,
        "Seconds its load must stay below what fewer replicas carry before one is drained and stopped (30)",
    ),
    Option(
        "serve_autoscale_interval_s",
        "GSWARM_SERVE_AUTOSCALE_INTERVAL",
        "serving.autoscale_interval",
        float,
        "Seconds between the autoscaler's samples of the gateway's live counts (0.5)",
    ),
    Option(
        "serve_drain_timeout_s",
        "GSWARM_SERVE_DRAIN_TIMEOUT",
        "serving.drain_timeout",
        float,
        "Seconds a replica being scaled down may finish its requests before it is stopped anyway (600)",
    ),
    Option(
        "serve_dram_budget",
        "GSWARM_SERVE_DRAM_BUDGET",
        "serving.dram_budget",
        _budget,
        "Model weights a node's DRAM keeps staged for the next scale-up after a replica is scaled down: bytes "
        "(64GiB) or a share of the node's memory (50%, the default)",
    ),
    Option(
        "serve_warm_start",
        "GSWARM_SERVE_WARM_START",
        "serving.warm_start",
        parse_bool,
        "Start built-in servers from a process that has their libraries imported (true): seconds faster",
    ),
    Option(
        "data_allowed_hosts",
        "GSWARM_DATA_ALLOWED_HOSTS",
        "data.allowed_hosts",
        _hosts,
        "Hosts (`host`, `host:port`, an address or a network such as `10.0.0.0/8`; comma-separated) `http(s)://` data"
        " sources may come from; a name that resolves to a private address needs that address listed too"
        " (none by default)",
    ),
    Option(
        "workflows_allowed_hosts",
        "GSWARM_WORKFLOWS_ALLOWED_HOSTS",
        "workflows.allowed_hosts",
        _hosts,
        "Hosts (`host`, `host:port`, an address or a network) a workflow's health_check and inference may call"
        " besides the services' replicas (none by default)",
    ),
    Option(
        "profiling_export_max_readings",
        "GSWARM_PROFILING_EXPORT_MAX_READINGS",
        "profiling.export_max_readings",
        int,
        "Most readings (a GPU's or a host's, at one time) one page of a profiler export holds (the rest follow"
        " with `cursor`), and one plot reads (a longer window is refused with 422: plot a part with `start` and"
        " `end`) (100000)",
    ),
    Option(
        "profiling_output_dir",
        "GSWARM_PROFILING_OUTPUT_DIR",
        "profiling.output_dir",
        _opt_str,
        "Where a stopped session's `<name>.json` is written: by the control worker (default $GSWARM_HOME/profiler)"
        " and by `gswarm profiler stop` (default the current directory)",
    ),
    Option(
        "profiling_output_format",
        "GSWARM_PROFILING_OUTPUT_FORMAT",
        "profiling.output_format",
        _output_format,
        "Layout of the `<name>.json` a stop writes: gswarm (the export) or original (the original gswarm's) (gswarm)",
    ),
    Option(
        "profiling_archive_interval_s",
        "GSWARM_PROFILING_ARCHIVE_INTERVAL",
        "profiling.archive_interval",
        float,
        "Seconds a frame waits in its node's stream before the control worker archives it, with the frames after"
        " it, while a session covers the node (30)",
    ),
    Option(
        "profiling_archive_segment_frames",
        "GSWARM_PROFILING_ARCHIVE_SEGMENT_FRAMES",
        "profiling.archive_segment_frames",
        int,
        "Most frames in one archived segment (one compressed row) (2000)",
    ),
    Option(
        "profiling_stream_max_frames",
        "GSWARM_PROFILING_STREAM_MAX_FRAMES",
        "profiling.stream_max_frames",
        int,
        "Frames a node's stream keeps (about; the node trims it as it adds): the buffer the archive is made from"
        " (200000: 55 h at 1 Hz, 5.5 h at 10 Hz)",
    ),
    Option(
        "data_max_inline",
        "GSWARM_DATA_MAX_INLINE",
        "data.max_inline",
        parse_size,
        "Largest chunk accepted inline as base64 in `POST /data` (16MiB)",
    ),
    Option(
        "data_inline_max_bytes",
        "GSWARM_DATA_INLINE_MAX_BYTES",
        "data.inline_max_bytes",
        parse_size,
        "Chunks up to this size travel inside their task message and are written by the node as they come; larger"
        " inline chunks wait in Redis for the node to fetch (64KiB)",
    ),
    Option(
        "data_batch_max_count",
        "GSWARM_DATA_BATCH_MAX_COUNT",
        "data.batch_max_count",
        int,
        "Most chunks one `POST /data/batch` may create; their bytes together are at most data.max_inline (1000)",
    ),
    Option(
        "data_max_size",
        "GSWARM_DATA_MAX_SIZE",
        "data.max_size",
        parse_size,
        "Largest chunk a node downloads from an `http(s)://` or `s3://` source (64GiB)",
    ),
    Option(
        "data_dram_capacity",
        "GSWARM_DATA_DRAM_CAPACITY",
        "data.dram_capacity",
        parse_size,
        "Bytes of chunks a node's `dram` tier keeps before evicting copies that exist elsewhere (0: no limit)",
    ),
    Option(
        "data_intermediate_ttl_s",
        "GSWARM_DATA_INTERMEDIATE_TTL",
        "data.intermediate_ttl",
        float,
        "Seconds an unreferenced `intermediate` chunk is kept before the collector removes it (3600)",
    ),
    Option(
        "data_gc_interval_s",
        "GSWARM_DATA_GC_INTERVAL",
        "data.gc_interval",
        float,
        "Seconds between runs of the chunk collector and DRAM eviction (60)",
    ),
    Option(
        "data_s3_enabled",
        "GSWARM_DATA_S3_ENABLED",
        "data.s3_enabled",
        parse_bool,
        "Accept `s3://` data sources (needs boto3 on the nodes; credentials from the usual AWS chain) (false)",
    ),
    Option(
        "data_s3_endpoint",
        "GSWARM_DATA_S3_ENDPOINT",
        "data.s3_endpoint",
        _opt_str,
        "Endpoint URL of an S3-compatible store (default: AWS)",
    ),
    Option("log_level", "GSWARM_LOG_LEVEL", "logging.level", str, "Log level of every process (INFO)"),
)


@dataclass
class Settings:
    """Every setting gswarm reads, resolved; see OPTIONS for where each comes from."""

    home: str = field(default_factory=lambda: str(Path("~/.gswarm").expanduser()))
    config_file: str | None = None
    database_url: str | None = None
    redis_url: str | None = None
    api_host: str = API_HOST
    api_port: int = API_PORT
    broker_port: int = 8090
    model_port: int = 9010
    join_token: str | None = None
    api_url: str | None = None
    token: str | None = None
    admin_token: str | None = None
    node_name: str | None = None
    node_address: str | None = None
    storage_root: str | None = None
    dram_root: str | None = None
    cache_size: int = 0
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
    offline_after_s: float = OFFLINE_AFTER_S
    max_concurrent_tasks: int = MAX_CONCURRENT_TASKS
    task_timeout_s: int = TASK_TIMEOUT_S
    retry_count: int = RETRY_COUNT
    task_events: bool = TASK_EVENTS
    visibility_timeout_s: int = VISIBILITY_TIMEOUT_S
    profiling_frequency_ms: int = PROFILING_FREQUENCY_MS
    profiling_bandwidth: bool = True
    profiling_nvlink: bool = False
    profiling_spill_max_bytes: int = 64_000_000
    placement_memory_overhead: float = 1.2
    allowed_roots: tuple[str, ...] = ()
    allow_remote_code: bool = False
    file_host: str | None = None
    file_port: int = 0
    transfer_secret: str | None = None
    transfer_token_ttl_s: int = 900
    transfer_streams: int = 4
    serve_port_start: int = 8080
    serve_ready_timeout_s: float = 300.0
    serve_check_interval_s: float = 10.0
    serve_cpu_threads: int = 1
    serve_engines: dict[str, Any] = field(default_factory=dict)
    serve_engine_paths: dict[str, str] = field(default_factory=dict)
    serve_command: None = None
    serve_cold_start_waiters: int = 16
    api_body_timeout_s: float = 10.0
    serve_scale_up_delay_s: float = 2.0
    serve_scale_down_delay_s: float = 30.0
    serve_autoscale_interval_s: float = 0.5
    serve_drain_timeout_s: float = 600.0
    serve_dram_budget: float = 0.5  # above 1: bytes; at most 1: a share of the node's memory
    serve_warm_start: bool = True
    data_allowed_hosts: tuple[str, ...] = ()
    workflows_allowed_hosts: tuple[str, ...] = ()
    profiling_export_max_readings: int = 100_000
    profiling_output_dir: str | None = None
    profiling_output_format: str = "gswarm"
    profiling_archive_interval_s: float = 30.0
    profiling_archive_segment_frames: int = 2000
    profiling_stream_max_frames: int = 200_000
    data_max_inline: int = 16 * 1024 * 1024
    data_inline_max_bytes: int = DATA_INLINE_MAX_BYTES
    data_batch_max_count: int = DATA_BATCH_MAX_COUNT
    data_max_size: int = 64 * 1024**3
    data_dram_capacity: int = 0
    data_intermediate_ttl_s: float = 3600.0
    data_gc_interval_s: float = 60.0
    data_s3_enabled: bool = False
    data_s3_endpoint: str | None = None
    log_level: str = "INFO"
    nodes: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    # Derived values: one place decides each default that depends on another setting.
    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{Path(self.home) / 'gswarm.db'}"

    @property
    def effective_redis_url(self) -> str:
        return self.redis_url or REDIS_URL

    @property
    def effective_api_url(self) -> str:
        return (self.api_url or f"http://{self.api_host}:{self.api_port}").rstrip("/")

    @property
    def effective_node_name(self) -> str:
        return self.node_name or _default_node_name()

    @property
    def token_file(self) -> Path:
        return Path(self.home) / "token"

    def effective_storage_root(self, node: str | None = None) -> Path:
        if self.storage_root:
            return Path(self.storage_root).expanduser()
        return Path(self.home) / "storage" / (node or self.effective_node_name)

    def effective_dram_root(self, node: str | None = None) -> Path:
        if self.dram_root:
            return Path(self.dram_root).expanduser()
        # Per user: a shared path another user could create first (or plant as a symlink) is never the default.
        return Path("/dev/shm") / f"gswarm-{os.geteuid()}" / (node or self.effective_node_name)

    def effective_dram_anchor(self) -> Path:
        """The existing directory the dram root is made in (privately): the tmpfs, or a configured root's parent."""
        return Path(self.dram_root).expanduser().parent if self.dram_root else Path("/dev/shm")

    def read_token(self) -> str | None:
        if self.token:
            return self.token
        try:
            return self.token_file.read_text().strip() or None
        except OSError:
            return None


def _lookup(doc: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = doc
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _parse(opt: Option, value: Any, source: str) -> Any:
    try:
        return opt.parse(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{source}: bad value for {opt.name}: {exc}", {"field": opt.env, "value": str(value)}
        ) from exc


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve settings from defaults, the config file and the environment (in that order)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("GSWARM_HOME") or "~/.gswarm").expanduser()
    config_file = env.get("GSWARM_CONFIG") or str(home / "config.yaml")
    doc: dict[str, Any] = {}
    if Path(config_file).is_file():
        try:
            loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{config_file}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_file}: the top level must be a mapping")
        check_keys(loaded, (o.path for o in OPTIONS if o.path), config_file)
        doc = loaded
    elif env.get("GSWARM_CONFIG"):
        raise ConfigError(
            f"GSWARM_CONFIG names {config_file}, which does not exist", {"field": "GSWARM_CONFIG"}
        )

    values: dict[str, Any] = {"home": str(home), "config_file": config_file}
    for opt in OPTIONS:
        if opt.name in ("home", "config_file"):
            continue
        if opt.path is not None:
            v = _lookup(doc, opt.path)
            if v is not None:
                values[opt.name] = _parse(opt, v, config_file)
        if env.get(opt.env) not in (None, ""):
            values[opt.name] = _parse(opt, env[opt.env], opt.env)

    nodes = parse_nodes(doc.get("nodes"), config_file, parse_size)
    settings = Settings(**values, nodes=nodes, raw=doc)
    if settings.node_name:
        validate_node_name(settings.node_name, "GSWARM_NODE_NAME")
    if settings.admin_token is not None and len(settings.admin_token) < ADMIN_TOKEN_MIN_CHARS:
        raise ConfigError(
            f"GSWARM_ADMIN_TOKEN has {len(settings.admin_token)} characters; an admin token needs at least"
            f" {ADMIN_TOKEN_MIN_CHARS} (for example `openssl rand -hex 24`)",
            {"field": "GSWARM_ADMIN_TOKEN"},
        )
    if settings.visibility_timeout_s <= settings.task_timeout_s:
        raise ConfigError(
            "queue.visibility_timeout must exceed queue.task_timeout, or Redis redelivers tasks that are still running",
            {"visibility_timeout": settings.visibility_timeout_s, "task_timeout": settings.task_timeout_s},
        )
    return settings
