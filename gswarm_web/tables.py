"""The control plane's tables (SQLAlchemy): nodes, tokens, models, services, workflows, tasks, sessions, chunks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, TypeDecorator
from sqlalchemy.orm import Mapped, mapped_column, relationship

from .extensions import db


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite keeps none of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Node(db.Model):  # type: ignore[name-defined]
    """A host running a node worker; one row per node name, written from its heartbeats."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    hostname: Mapped[str | None] = mapped_column(String(255))
    address: Mapped[str | None] = mapped_column(String(255))
    worker: Mapped[str | None] = mapped_column(String(255))
    version: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="up")
    cpu_count: Mapped[int | None] = mapped_column(Integer)
    cpu_percent: Mapped[float | None] = mapped_column(Float)
    dram_total_bytes: Mapped[int | None] = mapped_column(db.BigInteger)
    dram_available_bytes: Mapped[int | None] = mapped_column(db.BigInteger)
    storage: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    gpu_metrics: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    gpu_fingerprint: Mapped[str | None] = mapped_column(String(64))
    file_port: Mapped[int | None] = mapped_column(Integer)
    frames_dropped: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )  # frames lost to a bound
    # The serving engines it can run: preset -> {version, program, distribution}; None until it said.
    engines: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    allow_remote_code: Mapped[bool | None] = mapped_column(db.Boolean)  # its models.allow_remote_code
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status_recorded: Mapped[str] = mapped_column(String(16), default="healthy")

    gpus: Mapped[list[NodeGpu]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="NodeGpu.index", lazy="selectin"
    )


class NodeGpu(db.Model):  # type: ignore[name-defined]
    """A GPU of a node as NVML names it; live numbers stay in `Node.gpu_metrics`."""

    __tablename__ = "node_gpus"

    node_name: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    memory_total_bytes: Mapped[int | None] = mapped_column(db.BigInteger)

    node: Mapped[Node] = relationship(back_populates="gpus")


class ApiToken(db.Model):  # type: ignore[name-defined]
    """A bearer token; only its sha256 is kept."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    models: Mapped[list[str] | None] = mapped_column(JSON)  # an inference token's models (None: every one)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Model(db.Model):  # type: ignore[name-defined]
    """A registered model; where it lives is in `locations`, what it is made of in `manifest`."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model_type: Mapped[str] = mapped_column(String(64))
    source_url: Mapped[str | None] = mapped_column(String(1024))
    model_size: Mapped[int | None] = mapped_column(db.BigInteger)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    trust_remote_code: Mapped[bool] = mapped_column(db.Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16), default="registered", index=True)
    status_message: Mapped[str | None] = mapped_column(String(2000))
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    locations: Mapped[list[ModelLocation]] = relationship(
        back_populates="model", cascade="all, delete-orphan", order_by="ModelLocation.device", lazy="selectin"
    )


class ModelLocation(db.Model):  # type: ignore[name-defined]
    """A verified, complete copy of a model on one device (only ever recorded after the copy is in place)."""

    __tablename__ = "model_locations"

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    device: Mapped[str] = mapped_column(String(100), primary_key=True)
    node: Mapped[str] = mapped_column(String(63), index=True)
    tier: Mapped[str] = mapped_column(String(16))
    path: Mapped[str | None] = mapped_column(String(1024))
    size_bytes: Mapped[int | None] = mapped_column(db.BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    model: Mapped[Model] = relationship(back_populates="locations")


class Service(db.Model):  # type: ignore[name-defined]
    """A served model: a group of replicas (model server processes) with one status, behind the gateway.

    `device` is what was asked for: a device (the service is pinned there) or `auto` / `auto:gpu` / `auto:cpu`
    (placement chooses, and replaces a replica that dies). `replicas` is the count it is kept at.
    """

    __tablename__ = "services"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    device: Mapped[str] = mapped_column(String(100))
    replicas: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    port: Mapped[int | None] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(32), default="builtin")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="starting", index=True)
    status_message: Mapped[str | None] = mapped_column(String(2000))
    idle_timeout_s: Mapped[float | None] = mapped_column(Float)
    cold_start_timeout_s: Mapped[float] = mapped_column(Float, default=120.0, server_default="120")
    # min_replicas, max_replicas, a target (target_in_flight or target_queue_wait_s) and the delays; None: fixed
    autoscaling: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A change of engine or parameters starts a new generation: its replicas start, then the older ones drain.
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    model: Mapped[Model] = relationship(lazy="joined")
    members: Mapped[list[Replica]] = relationship(
        back_populates="service", cascade="all, delete-orphan", order_by="Replica.created_at", lazy="selectin"
    )


class Replica(db.Model):  # type: ignore[name-defined]
    """One model server process of a service, on one node's GPU or CPU (its id is the node's service id)."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    node: Mapped[str] = mapped_column(String(63), index=True)
    device: Mapped[str] = mapped_column(String(100))
    port: Mapped[int | None] = mapped_column(Integer)
    url: Mapped[str | None] = mapped_column(String(300))
    pid: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="starting", index=True)
    status_message: Mapped[str | None] = mapped_column(String(2000))
    healthy: Mapped[bool | None] = mapped_column(db.Boolean)
    task_id: Mapped[str | None] = mapped_column(String(36))  # the operation it waits for (a copy, its start)
    placement: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    engine: Mapped[str | None] = mapped_column(String(32))  # the preset its node started (`auto` resolved)
    draining_since: Mapped[datetime | None] = mapped_column(UTCDateTime)  # scaled down: no new request since
    generation: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )  # its service's, when it began
    last_check_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    service: Mapped[Service] = relationship(back_populates="members")


class ScalingEvent(db.Model):  # type: ignore[name-defined]
    """One change of an autoscaled service's replica count: when, from what to what, and why (the load seen)."""

    __tablename__ = "scaling_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    from_replicas: Mapped[int] = mapped_column(Integer)
    to_replicas: Mapped[int] = mapped_column(Integer)
    direction: Mapped[str] = mapped_column(String(8))  # up, down
    reason: Mapped[str] = mapped_column(String(500))
    load: Mapped[dict[str, Any] | None] = mapped_column(
        JSON
    )  # in flight, waiting, queue wait: what it decided on


class WorkflowRun(db.Model):  # type: ignore[name-defined]
    """A submitted workflow; its steps are rows of `tasks` with this workflow_id."""

    __tablename__ = "workflows"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    description: Mapped[str | None] = mapped_column(String(2000))
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)
    fail_fast: Mapped[bool] = mapped_column(db.Boolean, default=False)
    queue_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    document: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TaskRecord(db.Model):  # type: ignore[name-defined]
    """One operation sent to the fleet (its id is the Celery task id); live progress lives in Redis.

    A workflow's steps are tasks too: `workflow_id`, `step_id`, `depends_on`, `segment` and `outputs` are set.
    """

    __tablename__ = "tasks"
    # A node's (and the fleet's) latest finished operations, newest first: the queue's estimates (task_state.place).
    __table_args__ = (
        db.Index("ix_tasks_node_state_finished", "node", "state", "finished_at"),
        db.Index("ix_tasks_state_finished", "state", "finished_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    node: Mapped[str | None] = mapped_column(String(63), index=True)
    priority: Mapped[str] = mapped_column(String(16), default="normal")
    model_name: Mapped[str | None] = mapped_column(String(200), index=True)
    service_id: Mapped[str | None] = mapped_column(String(36))
    source_device: Mapped[str | None] = mapped_column(String(100))
    target_device: Mapped[str | None] = mapped_column(String(100))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    progress_done_bytes: Mapped[int | None] = mapped_column(db.BigInteger)
    progress_total_bytes: Mapped[int | None] = mapped_column(db.BigInteger)
    workflow_id: Mapped[str | None] = mapped_column(
        ForeignKey("workflows.id", ondelete="CASCADE"), index=True
    )
    step_id: Mapped[str | None] = mapped_column(String(64))
    depends_on: Mapped[list[str] | None] = mapped_column(JSON)
    segment: Mapped[int | None] = mapped_column(Integer)
    position: Mapped[int | None] = mapped_column(Integer)
    device: Mapped[str | None] = mapped_column(String(100))
    exclusive: Mapped[list[str] | None] = mapped_column(JSON)
    outputs: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What an operation's node task is sent with ({"task", "kwargs"}), kept until it reached the broker.
    message: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    dispatched: Mapped[bool] = mapped_column(db.Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ProfilerSession(db.Model):  # type: ignore[name-defined]
    """A named time window over the nodes' frame streams; its summary is kept when it stops."""

    __tablename__ = "profiler_sessions"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default="active", index=True)
    freq_ms: Mapped[int] = mapped_column(Integer, default=1000)
    nodes: Mapped[list[str]] = mapped_column(JSON, default=list)
    enable_bandwidth: Mapped[bool] = mapped_column(db.Boolean, default=True)
    enable_nvlink: Mapped[bool] = mapped_column(db.Boolean, default=False)
    start_time: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime)
    frame_count: Mapped[int | None] = mapped_column(Integer)
    host_frame_count: Mapped[int | None] = mapped_column(Integer)
    summary_by_device: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    summary_by_node: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request_time_info: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    sealed_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime
    )  # its frames archived whole, its file written
    output_file: Mapped[str | None] = mapped_column(String(1024))


class ProfilerFrameSegment(db.Model):  # type: ignore[name-defined]
    """Frames archived in stream order, zstd-compressed JSON lines: a node's stream (`session` "") or an imported
    session's; the key is the first frame's stream id, so a frame is archived once whoever archives it."""

    __tablename__ = "profiler_frame_segments"

    session: Mapped[str] = mapped_column(String(128), primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    first_ms: Mapped[int] = mapped_column(db.BigInteger, primary_key=True, autoincrement=False)
    first_seq: Mapped[int] = mapped_column(db.BigInteger, primary_key=True, autoincrement=False)
    last_ms: Mapped[int] = mapped_column(db.BigInteger)
    last_seq: Mapped[int] = mapped_column(db.BigInteger)
    frames: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(db.LargeBinary)


class DataChunk(db.Model):  # type: ignore[name-defined]
    """A chunk of bytes in the data pool; identified by id, deduplicated per device by its sha256."""

    __tablename__ = "data_chunks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    checksum: Mapped[str | None] = mapped_column(String(64), index=True)
    blake3: Mapped[str | None] = mapped_column(String(64))
    block_hashes: Mapped[list[str] | None] = mapped_column(JSON)  # blake3 of each 16 MiB block
    size: Mapped[int | None] = mapped_column(db.BigInteger)
    chunk_type: Mapped[str] = mapped_column(String(16), default="input")
    format: Mapped[str | None] = mapped_column(String(32))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    status_message: Mapped[str | None] = mapped_column(String(2000))
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)  # GET /data's order
    last_accessed: Mapped[datetime | None] = mapped_column(UTCDateTime)
    access_count: Mapped[int] = mapped_column(Integer, default=0)

    locations: Mapped[list[ChunkLocation]] = relationship(
        back_populates="chunk", cascade="all, delete-orphan", order_by="ChunkLocation.device", lazy="selectin"
    )
    refs: Mapped[list[ChunkRef]] = relationship(
        back_populates="chunk", cascade="all, delete-orphan", order_by="ChunkRef.holder", lazy="selectin"
    )


class ChunkLocation(db.Model):  # type: ignore[name-defined]
    """A verified copy of a chunk on one device."""

    __tablename__ = "chunk_locations"

    chunk_id: Mapped[str] = mapped_column(ForeignKey("data_chunks.id", ondelete="CASCADE"), primary_key=True)
    device: Mapped[str] = mapped_column(String(100), primary_key=True)
    node: Mapped[str] = mapped_column(String(63), index=True)
    tier: Mapped[str] = mapped_column(String(16))
    path: Mapped[str | None] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16), default="available")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    chunk: Mapped[DataChunk] = relationship(back_populates="locations")


class ChunkRef(db.Model):  # type: ignore[name-defined]
    """Something that keeps a chunk alive: an explicit pin, or a workflow that reads or writes it.

    A workflow's reference holds while the workflow runs; the collector ignores it once the workflow ended."""

    __tablename__ = "chunk_refs"

    chunk_id: Mapped[str] = mapped_column(ForeignKey("data_chunks.id", ondelete="CASCADE"), primary_key=True)
    holder: Mapped[str] = mapped_column(String(160), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="pin")
    workflow_id: Mapped[str | None] = mapped_column(
        ForeignKey("workflows.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    chunk: Mapped[DataChunk] = relationship(back_populates="refs")
