"""The `/services` API's schemas: a service, its replicas, what a request may ask and the autoscaler's view."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import marshmallow as ma

from ..control.serving import autoscaler
from ..control.serving import state as service_state
from ..control.serving.config import LOAD_BALANCING
from ..control.serving.state import REPLICA_STATES, SERVICE_STATES, service_healthy
from ..tables import Replica, Service
from .pagination import PageArgsSchema, PageSchema


def first_replica(s: Service) -> Replica | None:
    """The replica that speaks for a service in its flat fields: a running one, else a live one, else the newest."""
    for wanted in (("running",), service_state.LIVE, REPLICA_STATES):
        found = [r for r in s.members if r.status in wanted]
        if found:
            return found[0] if wanted != REPLICA_STATES else found[-1]
    return None


def _of_first(key: str) -> Any:
    return lambda s: getattr(first_replica(s), key, None)


class ReplicaSchema(ma.Schema):
    id = ma.fields.String()
    node = ma.fields.String()
    device = ma.fields.String()
    port = ma.fields.Integer(allow_none=True)
    url = ma.fields.String(allow_none=True)
    pid = ma.fields.Integer(allow_none=True)
    status = ma.fields.String(metadata={"enum": list(REPLICA_STATES)})
    status_message = ma.fields.String(allow_none=True)
    healthy = ma.fields.Function(
        lambda r: r.healthy if r.status in ("running", "unhealthy", "draining") else None,
        allow_none=True,
        metadata={"description": "its last check, while it serves (null before it runs and once it stopped)"},
    )
    placement = ma.fields.Dict(
        allow_none=True, metadata={"description": "the chosen device, candidates, reasons"}
    )
    engine = ma.fields.String(allow_none=True, metadata={"description": "the preset its node started"})
    draining_since = ma.fields.DateTime(
        allow_none=True, metadata={"description": "scaled down: no new request"}
    )
    last_check_at = ma.fields.DateTime(allow_none=True)
    started_at = ma.fields.DateTime(allow_none=True)
    stopped_at = ma.fields.DateTime(allow_none=True)


class ServiceSchema(ma.Schema):
    id = ma.fields.String()
    model_name = ma.fields.Function(lambda s: s.model.name)
    requested_device = ma.fields.String(
        attribute="device", metadata={"description": "a device, or auto[:gpu|cpu]"}
    )
    node = ma.fields.Function(_of_first("node"), allow_none=True)
    device = ma.fields.Function(lambda s: getattr(first_replica(s), "device", None) or s.device)
    port = ma.fields.Function(_of_first("port"), allow_none=True)
    url = ma.fields.Function(_of_first("url"), allow_none=True)
    pid = ma.fields.Function(_of_first("pid"), allow_none=True)
    healthy = ma.fields.Function(
        service_healthy,
        allow_none=True,
        metadata={"description": "every running replica passed its last check"},
    )
    last_check_at = ma.fields.Function(lambda s: _iso(getattr(first_replica(s), "last_check_at", None)))
    started_at = ma.fields.Function(lambda s: _iso(getattr(first_replica(s), "started_at", None)))
    replicas = ma.fields.Integer(metadata={"description": "the count the service is kept at"})
    ready_replicas = ma.fields.Function(lambda s: sum(r.status == "running" for r in s.members))
    instances = ma.fields.List(ma.fields.Nested(ReplicaSchema), attribute="members")
    backend = ma.fields.String(metadata={"description": "the serving preset (the same as `engine`)"})
    engine = ma.fields.Function(lambda s: s.backend, metadata={"description": "the serving preset"})
    config = ma.fields.Function(lambda s: {k: v for k, v in (s.config or {}).items() if k != "nodes"})
    nodes = ma.fields.Function(
        lambda s: (s.config or {}).get("nodes"),
        metadata={"description": "the nodes it is pinned to, one replica each"},
    )
    status = ma.fields.String(metadata={"enum": list(SERVICE_STATES)})
    status_message = ma.fields.String(allow_none=True)
    idle_timeout_s = ma.fields.Float(allow_none=True)
    cold_start_timeout_s = ma.fields.Float()
    autoscaling = ma.fields.Function(
        lambda s: _policy_doc(s),
        allow_none=True,
        metadata={"description": "the autoscaler's policy (null: fixed)"},
    )
    gateway_model = ma.fields.Function(
        lambda s: s.model.name, metadata={"description": "`model` at /v1 of the gateway"}
    )
    stopped_at = ma.fields.DateTime(allow_none=True)
    created_at = ma.fields.DateTime()


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _policy_doc(svc: Service) -> dict[str, Any] | None:
    policy = autoscaler.policy_of(svc)
    return policy.doc() if policy is not None else None


AUTOSCALING = {
    "description": "scale between min_replicas and max_replicas on a target: target_in_flight (requests in flight "
    "per replica, the gateway's queue included; 4 by default), target_queue_wait_s (mean seconds requests wait "
    "in the gateway's queue) or target_engine_waiting (requests waiting in each replica's engine's own queue: "
    "vllm:num_requests_waiting, sglang:num_queue_reqs, llamacpp:requests_deferred); scale_up_delay_s and "
    "scale_down_delay_s (serving.scale_up_delay, 2, and "
    "serving.scale_down_delay, 30, by default). min_replicas 0: the service sleeps until a request comes"
}


class ServiceStartedSchema(ServiceSchema):
    task_id = ma.fields.String()


class ServiceStatusSchema(ma.Schema):
    id = ma.fields.String()
    status = ma.fields.String()
    healthy = ma.fields.Boolean(allow_none=True)
    uptime_s = ma.fields.Float(allow_none=True)
    last_check_at = ma.fields.DateTime(allow_none=True)
    url = ma.fields.String(allow_none=True)
    message = ma.fields.String(allow_none=True)
    replicas = ma.fields.Integer()
    ready_replicas = ma.fields.Integer()


class ServiceCreateSchema(ma.Schema):
    model_name = ma.fields.String(required=True)
    device = ma.fields.String(
        load_default="auto",
        metadata={"description": "node1:gpu0, node1:cpu, or auto / auto:gpu / auto:cpu (default)"},
    )
    nodes = ma.fields.List(
        ma.fields.String(),
        validate=ma.validate.Length(min=1, max=64),
        metadata={
            "description": "serve one replica on each of these nodes (names or addresses), and only there"
        },
    )
    replicas = ma.fields.Integer(
        validate=ma.validate.Range(min=1, max=64), metadata={"description": "1 by default"}
    )
    port = ma.fields.Integer(validate=ma.validate.Range(min=1024, max=65535))
    engine = ma.fields.String(
        metadata={
            "description": "a serving preset of the nodes: builtin (default), vllm, sglang, tgi, llama.cpp, or "
            "one a node's serving.engines adds"
        }
    )
    config = ma.fields.Dict(
        load_default=dict,
        metadata={
            "description": "the preset's documented parameters (builtin: task, max_batch_size, threads; "
            "vllm, sglang, tgi: tensor_parallel_size, max_model_len, dtype; llama.cpp: max_model_len, threads); "
            "`backend` or `framework` name the preset too; the service's own keys as the original has them: "
            f"`port`, `replicas`, `load_balancing` ({' or '.join(LOAD_BALANCING)}), `timeout` (seconds a replica "
            "has to answer a request). Never a command: `command` is refused"
        },
    )
    idle_timeout_s = ma.fields.Float(validate=ma.validate.Range(min=1, max=30 * 86400))
    cold_start_timeout_s = ma.fields.Float(load_default=120.0, validate=ma.validate.Range(min=1, max=3600))
    autoscaling = ma.fields.Dict(metadata=AUTOSCALING)


class ServiceUpdateSchema(ma.Schema):
    replicas = ma.fields.Integer(validate=ma.validate.Range(min=0, max=64))
    engine = ma.fields.String(
        metadata={
            "description": "another serving preset: a rolling update (new replicas first, then the old drain)"
        }
    )
    config = ma.fields.Dict(
        metadata={"description": "the preset's parameters and the service's own keys, whole: other parameters are a "
                  "rolling update; aliases, timeout, load_balancing and max_in_flight apply at once"}
    )  # fmt: skip

    @ma.validates("config")
    def _no_command(self, value: Any, **_: Any) -> None:
        if isinstance(value, dict) and "command" in value:
            raise ma.ValidationError(
                "commands are configured on the node (serving.engines), never in a request"
            )

    idle_timeout_s = ma.fields.Float(allow_none=True, validate=ma.validate.Range(min=1, max=30 * 86400))
    autoscaling = ma.fields.Dict(allow_none=True, metadata={**AUTOSCALING, "description": AUTOSCALING["description"]
                                                            + "; null turns it off"})  # fmt: skip


class ScalingEventSchema(ma.Schema):
    at = ma.fields.String()
    from_replicas = ma.fields.Integer()
    to_replicas = ma.fields.Integer()
    direction = ma.fields.String(metadata={"enum": ["up", "down"]})
    reason = ma.fields.String()
    seen = ma.fields.Dict(
        attribute="load",
        data_key="load",
        allow_none=True,
        metadata={"description": "in_flight, waiting, queue_wait_s, engine_waiting"},
    )


class ScalingSchema(ma.Schema):
    service_id = ma.fields.String()
    autoscaling = ma.fields.Dict(allow_none=True)
    replicas = ma.fields.Integer()
    ready_replicas = ma.fields.Integer()
    draining_replicas = ma.fields.Integer()
    in_flight = ma.fields.Dict(
        metadata={"description": "requests in flight per replica, over every web process"}
    )
    waiting = ma.fields.Integer(metadata={"description": "requests waiting in the gateway's queue"})
    engine_waiting = ma.fields.Float(
        allow_none=True,
        metadata={
            "description": "requests waiting in the replicas' engines' own queues (null: none reports one)"
        },
    )
    events = ma.fields.List(ma.fields.Nested(ScalingEventSchema))


class ServiceListArgsSchema(PageArgsSchema):
    status = ma.fields.String(validate=ma.validate.OneOf(SERVICE_STATES))
    model_name = ma.fields.String()
    node = ma.fields.String()


class ServiceListSchema(PageSchema):
    services = ma.fields.List(ma.fields.Nested(ServiceSchema))
