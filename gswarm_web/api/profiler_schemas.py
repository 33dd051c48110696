"""Schemas of the profiler's endpoints: sessions, their exports and plots, recovery and imports."""

from __future__ import annotations

from datetime import UTC

import marshmallow as ma

from ..profiling.export import HOST_KEYS

NAME = ma.validate.Regexp(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", error="letters, digits, `_`, `.` and `-`, at most 128"
)
HOST = ma.validate.Regexp(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$", error="a host name")
MAX_IMPORT_FRAMES = 10_000  # per request
MAX_TIME = 1e11  # seconds since the epoch (year 5138): a stream id's milliseconds stay far inside 64 bits


class SessionCreateSchema(ma.Schema):
    name = ma.fields.String(validate=NAME, metadata={"description": "default: session_YYYYmmdd_HHMMSS"})
    freq_ms = ma.fields.Integer(load_default=1000, validate=ma.validate.Range(min=100, max=3_600_000))
    nodes = ma.fields.List(ma.fields.String(), load_default=list)
    enable_bandwidth = ma.fields.Boolean(load_default=True)
    enable_nvlink = ma.fields.Boolean(load_default=False)


class SessionSchema(ma.Schema):
    name = ma.fields.String()
    status = ma.fields.String(
        attribute="state", metadata={"enum": ["active", "stopped", "importing", "imported"]}
    )
    freq_ms = ma.fields.Integer()
    nodes = ma.fields.List(ma.fields.String())
    enable_bandwidth = ma.fields.Boolean()
    enable_nvlink = ma.fields.Boolean()
    start_time = ma.fields.DateTime()
    end_time = ma.fields.DateTime(allow_none=True)
    frame_count = ma.fields.Integer(allow_none=True, metadata={"description": "frames with GPU readings"})
    host_frame_count = ma.fields.Integer(
        allow_none=True, metadata={"description": "host readings (every frame)"}
    )
    summary_by_device = ma.fields.Dict(allow_none=True)
    summary_by_node = ma.fields.Dict(allow_none=True)
    sealed_at = ma.fields.DateTime(
        allow_none=True,
        metadata={"description": "when a stopped session had every frame archived and its file"},
    )
    output_file = ma.fields.String(
        allow_none=True, metadata={"description": "the `<name>.json` written at the stop"}
    )


class RecordSchema(ma.Schema):
    app = ma.fields.String(required=True)
    queue_time = ma.fields.Float(required=True, validate=ma.validate.Range(min=0))
    processing_time = ma.fields.Float(required=True, validate=ma.validate.Range(min=0))


class WindowArgsSchema(ma.Schema):
    start = ma.fields.DateTime(
        metadata={"description": "only from this time on (ISO 8601; UTC unless it says)"}
    )
    end = ma.fields.DateTime(metadata={"description": "only up to this time (ISO 8601; UTC unless it says)"})


class ExportArgsSchema(WindowArgsSchema):
    cursor = ma.fields.String(metadata={"description": "the `next_cursor` of the page before"})
    all = ma.fields.Boolean(
        load_default=False,
        metadata={"description": "the whole window in one answer, streamed (no pages, no bound)"},
    )

    @ma.validates_schema
    def _one_way(self, data: dict, **_: object) -> None:
        if data.get("all") and data.get("cursor"):
            raise ma.ValidationError("all: the whole window has no pages (no cursor)", "cursor")


class PlotArgsSchema(WindowArgsSchema):
    format = ma.fields.String(load_default="png", validate=ma.validate.OneOf(("png", "pdf")))


class RecoverSchema(ma.Schema):
    name = ma.fields.String(validate=NAME, metadata={"description": "only this session (default: every one)"})


class RecoverableSchema(ma.Schema):
    name = ma.fields.String()
    status = ma.fields.String()
    start_time = ma.fields.DateTime()
    end_time = ma.fields.DateTime(allow_none=True)
    nodes = ma.fields.List(ma.fields.String())
    frames = ma.fields.Integer(metadata={"description": "frames its nodes recorded in its window, every one"})
    archived_frames = ma.fields.Integer()
    pending_frames = ma.fields.Integer(metadata={"description": "still only in the nodes' streams"})
    published = ma.fields.Boolean(metadata={"description": "the nodes sample for it"})
    archiver_seen_s = ma.fields.Float(
        allow_none=True, metadata={"description": "seconds since the archiver ran"}
    )
    interrupted = ma.fields.List(ma.fields.String(), metadata={"description": "what `recover` would resume"})


class ImportSchema(ma.Schema):
    name = ma.fields.String(required=True, validate=NAME)
    start_time = ma.fields.AwareDateTime(required=True, default_timezone=UTC)
    end_time = ma.fields.AwareDateTime(load_default=None, allow_none=True, default_timezone=UTC)
    freq_ms = ma.fields.Integer(load_default=1000, validate=ma.validate.Range(min=1, max=3_600_000))
    nodes = ma.fields.List(
        ma.fields.String(validate=HOST), required=True, validate=ma.validate.Length(min=1, max=10_000)
    )
    enable_bandwidth = ma.fields.Boolean(load_default=True)
    enable_nvlink = ma.fields.Boolean(load_default=False)
    request_time_info = ma.fields.List(
        ma.fields.Dict(), load_default=list, validate=ma.validate.Length(max=100_000)
    )

    @ma.validates_schema
    def _end_after_start(self, data: dict, **_: object) -> None:
        if data.get("end_time") is not None and data["end_time"] < data["start_time"]:
            raise ma.ValidationError("end_time is before start_time", "end_time")


def _reading() -> ma.fields.Float:
    return ma.fields.Float(allow_none=True)


class GpuReadingSchema(ma.Schema):
    index = ma.fields.Integer(required=True)
    name = ma.fields.String(required=True, validate=ma.validate.Length(max=256))
    utilization_percent = _reading()
    memory_percent = _reading()
    pcie_rx_bytes_per_s = _reading()
    pcie_tx_bytes_per_s = _reading()
    nvlink_rx_bytes_per_s = _reading()
    nvlink_tx_bytes_per_s = _reading()


HostReadingSchema = ma.Schema.from_dict({k: _reading() for k in HOST_KEYS}, name="HostReadingSchema")


class FrameSchema(ma.Schema):
    node = ma.fields.String(required=True, validate=HOST)
    time = ma.fields.Float(
        required=True,
        validate=ma.validate.Range(min=0, max=MAX_TIME),
        metadata={"description": "seconds since the epoch"},
    )
    seq = ma.fields.Integer()
    gpus = ma.fields.List(
        ma.fields.Nested(GpuReadingSchema), load_default=list, validate=ma.validate.Length(max=256)
    )
    host = ma.fields.Nested(HostReadingSchema, load_default=dict)


class ImportFramesSchema(ma.Schema):
    frames = ma.fields.List(
        ma.fields.Nested(FrameSchema),
        required=True,
        validate=ma.validate.Length(min=1, max=MAX_IMPORT_FRAMES),
    )
