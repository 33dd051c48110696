"""Every name the fleet shares: queues, priorities, task names, streams and Redis keys.

Nodes and the control plane meet only through these names; nothing else spells one out.
"""

from __future__ import annotations

from typing import Any

# ---- queues and priorities ------------------------------------------------------------------------------------

CONTROL_QUEUE = "control"
# Priority names mapped onto Redis priority steps; on Redis 0 is served first.
PRIORITIES = {"critical": 0, "high": 3, "normal": 6, "low": 9}
PRIORITY_NAMES = tuple(PRIORITIES)
PRIORITY_STEPS = [0, 3, 6, 9]

# ---- tasks ----------------------------------------------------------------------------------------------------

NODE_PING = "gswarm.node.ping"
NODE_INFO = "gswarm.node.info"
MODEL_DOWNLOAD = "gswarm.node.model.download"
MODEL_COPY = "gswarm.node.model.copy"
MODEL_MOVE = "gswarm.node.model.move"
MODEL_DELETE = "gswarm.node.model.delete"
MODEL_REGISTER = "gswarm.node.model.register"  # verify a copy already on the node, then report it
SERVICE_START = "gswarm.node.service.start"
SERVICE_STOP = "gswarm.node.service.stop"
SERVICE_PREWARM = (
    "gswarm.node.service.prewarm"  # start the warm starter of built-in servers ahead of scale-ups
)
DATA_CREATE = "gswarm.node.data.create"
DATA_CREATE_BATCH = "gswarm.node.data.create_batch"  # many small chunks, bytes in the message
DATA_COPY = "gswarm.node.data.copy"
DATA_DELETE = "gswarm.node.data.delete"
WORKFLOW_STEP = "gswarm.node.workflow.step"

CONTROL_TASKS = "gswarm.control.*"
SWEEP_NODES = "gswarm.control.sweep_nodes"
SWEEP_OUTBOX = "gswarm.control.workflow_sweep"
DATA_GC = "gswarm.control.data_gc"
SERVICE_SWEEP = "gswarm.control.services"  # keeps services at their replica counts (also sent by the gateway)

# ---- streams (each read by the control worker's consumer group `CONTROL_GROUP`) -------------------------------

CONTROL_GROUP = "control"
# Every node -> control report but heartbeats and frames: operation phases and results, step events, services.
REPORTS_STREAM = "gswarm:reports"
REPORTS_MAXLEN = 1_000_000
# The kinds of report, each routed to the bookkeeping of its resource.
REPORT_OPERATION = (
    "operation"  # a standalone operation (a TaskRecord): started, phase, retrying, succeeded, failed
)
REPORT_STEP = "step"  # a workflow step: started, retrying, succeeded, failed, cancelled
REPORT_SERVICES = "services"  # the health of every service a node runs, after each round of checks
DEAD_REPORTS_STREAM = (
    "gswarm:reports:dead"  # reports the control plane could not apply, kept for a person to read
)
HEARTBEAT_STREAM = "gswarm:heartbeats"
HEARTBEAT_MAXLEN = 100_000
FRAMES_MAXLEN = 200_000  # per node: 55 h at 1 Hz, 5.5 h at 10 Hz


def frames_stream(node: str) -> str:
    """One frame stream per node (`*` matches them all)."""
    return f"gswarm:frames:{node}"


def node_of_frames_stream(stream: str) -> str:
    return stream.removeprefix("gswarm:frames:")


# ---- keys -----------------------------------------------------------------------------------------------------

CONTROL_ALIVE_KEY = "gswarm:control-workers"  # hash: consumer -> last time it polled
TRANSFER_SECRET_KEY = "gswarm:transfer-secret"
PROFILER_SESSIONS_KEY = "gswarm:profiler:sessions"  # hash: session -> what its nodes should sample
PROFILER_SESSIONS_CHANNEL = (
    "gswarm:profiler:sessions:changed"  # pub/sub (see channel()): the hash above changed
)
METRICS_LATEST_KEY = "gswarm:metrics:latest"  # hash: node -> its newest frame
METRICS_SEEN_KEY = "gswarm:metrics:latest:seen"
SERVICE_LAST_REQUEST_KEY = "gswarm:services:last-request"  # hash: service -> time of its last gateway request
ENGINE_METRICS_KEY = (
    "gswarm:serve:engine-metrics"  # hash: replica -> {at, node, text}: its engine's last /metrics
)
SWEEP_ASKED_KEY = (
    "gswarm:services:sweep-asked"  # set (with a short expiry) while a gateway's sweep is asked for
)
# Pub/sub: every change of a node, task, workflow step, service or profiler session, as JSON, published by the
# process that committed it (the control worker as it applies reports, the web app for what a request changed);
# each web process forwards it to its /api/v1/events sockets.
EVENTS_CHANNEL = "gswarm:events"


def channel(name: str, client: Any) -> str:
    """The pub/sub channel `name` of the cluster whose Redis database `client` uses. Redis' channels belong to the
    server, not to a database: two clusters on one server (each in a database of its own) would hear each other's
    events without the database in the name."""
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return f"{name}@{db}"


SERVICE_KEYS_KEY = "gswarm:services:keys"  # hash: replica URL -> the secret its server accepts requests with
RECONCILER_LOCK_KEY = "gswarm:lock:reconciler"  # one round of the service reconciler at a time
# The gateway's live counts, shared by every web process (control/live.py): `r:<replica>` in flight and
# `w:<service>` waiting; each process's own share under SERVE_PROC_PREFIX + its id while its lease lives.
SERVE_LIVE_KEY = "gswarm:serve:live"
SERVE_PROCS_KEY = "gswarm:serve:procs"  # set: the web processes with a share
SERVE_PROC_PREFIX = "gswarm:serve:proc:"
SERVE_LEASE_PREFIX = "gswarm:serve:lease:"
SERVE_DRAINING_KEY = "gswarm:serve:draining"  # set: replicas that take no new request
SERVE_VERSION_KEY = "gswarm:serve:version"  # changes whenever a replica starts or stops serving
SERVE_TURNS_KEY = (
    "gswarm:serve:turns"  # hash: model -> the next turn (ties and round_robin, across processes)
)
SERVE_STATS_PREFIX = (
    "gswarm:serve:stats:"  # hash per replica (or `svc:<service>`): counters and histogram buckets
)
AUTOSCALER_LOCK_KEY = "gswarm:lock:autoscaler"  # one autoscaler tick at a time across control workers
KEEP_S = 7 * 24 * 3600  # how long per-task keys live


def starts_key(task_id: str) -> str:
    """How many times a task started, over its retries and redeliveries (a crash's included): its attempt number."""
    return f"gswarm:starts:{task_id}"


def deliveries_key(task_id: str, attempt: int) -> str:
    return f"gswarm:deliveries:{task_id}:{attempt}"


def progress_key(op_id: str) -> str:
    return f"gswarm:progress:{op_id}"


def op_done_key(op_id: str) -> str:
    return f"gswarm:op-done:{op_id}"


def device_lock_key(device: str) -> str:
    return f"gswarm:lock:device:{device}"


def model_lock_key(node: str, tier: str, model: str) -> str:
    """Held while an operation writes or removes `model`'s copy on one tier of one node."""
    return f"gswarm:lock:model:{node}:{tier}:{model}"


def step_done_key(task_id: str) -> str:
    return f"gswarm:step-done:{task_id}"


def inline_step_key(task_id: str) -> str:
    """The step that the message `task_id` runs now, after its own (workflows/inline.py)."""
    return f"gswarm:step-inline:{task_id}"


def inline_message_key(task_id: str) -> str:
    """The message that runs the step `task_id` after its own step (workflows/inline.py), for a cancel to stop it."""
    return f"gswarm:step-inline-in:{task_id}"


def workflow_outputs_key(workflow_id: str) -> str:
    return f"gswarm:wf:{workflow_id}:outputs"


def workflow_specs_key(workflow_id: str) -> str:
    return f"gswarm:wf:{workflow_id}:specs"


def cancel_workflow_key(workflow_id: str) -> str:
    return f"gswarm:cancel:wf:{workflow_id}"


def cancel_task_key(task_id: str) -> str:
    return f"gswarm:cancel:task:{task_id}"


def chunk_batch_key(first_chunk_id: str) -> str:
    """The chunks of one batch create (ids, base64 bytes, checksums, as JSON) while its node has not stored them
    (when together they are above data.inline_max_bytes); named by the batch's first chunk."""
    return f"gswarm:chunk-batch:{first_chunk_id}"


def chunk_bytes_key(chunk_id: str) -> str:
    """A created chunk's base64 bytes while its node has not stored them (those above data.inline_max_bytes)."""
    return f"gswarm:chunk-bytes:{chunk_id}"


def untaken_key(task_id: str) -> str:
    """When the control plane first saw an operation's message taken by no node (dispatch.resend_untaken)."""
    return f"gswarm:untaken:{task_id}"
