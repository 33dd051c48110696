"""The action types of a workflow: their fields and their outputs (`schemas` loads each into a typed action), and
the list of problems a document has, each naming its action and field:
`actions[load_gpu].target_device: 'node1:gpuX' has unknown tier`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gswarm_tasks.devices import AUTO
from gswarm_tasks.errors import GswarmError, InvalidRequest

ACTION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MODEL_ACTIONS = ("download", "move", "copy", "delete", "serve", "stop_serve")
DATA_ACTIONS = ("data_create", "data_move", "data_transfer", "inference", "data_merge")
AVAILABLE = frozenset({*MODEL_ACTIONS, *DATA_ACTIONS, "health_check", "noop"})
CHUNK_FIELDS = ("data_id", "input_data", "input_data_id", "input")  # fields that name one chunk
DEVICE_FIELDS = ("source_device", "target_device", "device", "output_device")
# Device fields that may be left out (or written `auto` / `auto:<kind>`): placement fills them at submission.
AUTO_DEFAULTS: dict[str, tuple[str, ...]] = {
    "download": ("target_device",),
    "move": ("source_device", "target_device"),
    "copy": ("source_device", "target_device"),
    "serve": ("device",),
    "data_create": ("target_device",),
    "inference": ("output_device",),
    "data_merge": ("output_device",),
}

COMMON = {
    "action_id",
    "action_type",
    "dependencies",
    "devices",
    "priority",
    "retries",
    "retry_backoff",
    "timeout_s",
    "node",
    "description",
    "exclusive",
}
# Fields of each action type, and the outputs later actions may reference as ${action.field}.
FIELDS: dict[str, set[str]] = {
    "download": {"model_name", "source_url", "target_device", "model_type", "verify_checksum"},
    "move": {"model_name", "source_device", "target_device", "keep_source", "verify_checksum"},
    "copy": {"model_name", "source_device", "target_device", "bandwidth_limit"},
    "delete": {"model_name", "device", "target_device"},
    "serve": {"model_name", "device", "port", "config"},
    "stop_serve": {"model_name", "device", "service_id"},
    "health_check": {"target_url", "expected_status", "timeout"},
    "noop": {"duration_s", "fail_times", "outputs"},
    "data_create": {"source", "data", "data_type", "format", "target_device", "metadata"},
    "data_move": {"data_id", "target_device"},
    "data_transfer": {"data_id", "target_node", "target_device", "delete_source"},
    "inference": {
        "model_name",
        "service_url",
        "service",
        "endpoint",
        "input_data",
        "input_data_id",
        "input",
        "output_device",
        "data_type",
        "metadata",
    },
    "data_merge": {"inputs", "output_device", "format", "data_type", "metadata"},
}
DATA_OUTPUTS = {"chunk_id", "device", "size", "checksum", "path"}
OUTPUTS: dict[str, set[str]] = {
    "download": {"device", "path", "size_bytes"},
    "move": {"device", "path", "size_bytes"},
    "copy": {"device", "path", "size_bytes"},
    "delete": {"device"},
    "serve": {"service_url", "service_id", "port", "device"},
    "stop_serve": {"service_id"},
    "health_check": {"status_code", "url"},
    "noop": set(),
    "data_create": DATA_OUTPUTS,
    "data_move": DATA_OUTPUTS,
    "data_transfer": DATA_OUTPUTS,
    "inference": DATA_OUTPUTS,
    "data_merge": DATA_OUTPUTS,
}


class Errors:
    """Every problem of a document, each naming its action and field; raised together."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, where: str, message: str) -> None:
        self.items.append({"field": where, "message": message})

    def check(self, where: str, fn: Callable[[], Any]) -> Any:
        """fn's value, or None with its refusal added (its message without the field it starts with)."""
        try:
            return fn()
        except GswarmError as exc:
            message = exc.message
            for named in (where, where.split(".")[-1]):
                message = message.removeprefix(f"{named}: ")
            self.add(where, message)
            return None

    def raise_if_any(self) -> None:
        if self.items:
            first = self.items[0]
            more = f" (and {len(self.items) - 1} more)" if len(self.items) > 1 else ""
            raise InvalidRequest(f"{first['field']}: {first['message']}{more}", {"errors": self.items})


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and (value == AUTO or value.startswith(AUTO + ":"))
