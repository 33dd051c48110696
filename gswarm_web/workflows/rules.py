"""What an action type needs besides well-formed fields: the fields it requires (or the alternatives it takes), and
devices of the right kind (a chunk lives on a node's disk or dram). Read from the typed fields `schemas` loaded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gswarm_tasks.devices import Device

from .actions import AUTO_DEFAULTS, DATA_ACTIONS, MODEL_ACTIONS

# The device fields placement fills at submission, per action type (a chunk's move or transfer names its device, or
# `auto`); `auto` anywhere else is refused.
PLACED: dict[str, tuple[str, ...]] = {
    **AUTO_DEFAULTS,
    "data_move": ("target_device",),
    "data_transfer": ("target_device",),
}
# One of these is required: (the field named when none is given, the alternatives, what the message says).
ONE_OF: dict[str, list[tuple[str, tuple[str, ...], str]]] = {
    "stop_serve": [("device", ("device", "service_id"), "required (or service_id) for a stop_serve action")],
    "data_create": [("source", ("source", "data"), "required (or data) for a data_create action")],
    "data_transfer": [
        (
            "target_device",
            ("target_device", "target_node"),
            "required (or target_node) for a data_transfer action",
        )
    ],
    "inference": [
        (
            "input_data",
            ("input_data", "input_data_id", "input"),
            "required (input_data, input_data_id or input)",
        ),
        (
            "service_url",
            ("service_url", "service", "model_name"),
            "required (service_url, service or model_name)",
        ),
    ],
}
# Required besides the device fields placement fills when they are left out (`AUTO_DEFAULTS`).
NEEDS: dict[str, tuple[str, ...]] = {
    "delete": ("device",),
    "health_check": ("target_url",),  # its form is checked by `urls.check_url_fields`
    "data_move": ("data_id", "target_device"),
    "data_transfer": ("data_id",),
}


def _given(p: dict[str, Any], key: str) -> bool:
    return p.get(key) not in (None, "")


def rules(atype: str, p: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, problem) for each rule of `atype` that the loaded fields `p` break."""
    for key in (
        ("model_name",) * (atype in MODEL_ACTIONS) + AUTO_DEFAULTS.get(atype, ()) + NEEDS.get(atype, ())
    ):
        if not _given(p, key):
            yield key, f"required for a {atype} action"
    for key, alternatives, message in ONE_OF.get(atype, ()):
        if not any(p.get(k) if k != "data" else p.get(k) is not None for k in alternatives):
            yield key, message
    if atype == "data_merge" and not p.get("inputs"):
        yield "inputs", "must be a non-empty list"
    if atype in DATA_ACTIONS:
        for key in ("target_device", "output_device"):
            dev = p.get(key)
            if isinstance(dev, Device) and not dev.is_file_tier:
                yield key, f"{str(dev)!r} is not a data tier: chunks live on a node's disk or dram"
    node = p.get("target_node")
    if atype == "data_transfer" and isinstance(node, str) and "${" not in node:
        dev = p.get("target_device")
        if isinstance(dev, Device) and dev.node != node:
            yield "target_device", f"{str(dev)!r} is not on target_node {node!r}"
