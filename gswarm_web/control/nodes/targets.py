"""A bare tier where the API asks for a device (`disk`, `dram`, `gpu0`, `cpu`, as the original's client-node API
writes them): that tier of the node the request makes known (the other device of a copy or move, the one node a
service is asked on), else `auto:<tier>`: placement chooses a device of that kind."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, TypeVar

from gswarm_tasks.devices import AUTO, TIER_RE, Device
from gswarm_tasks.errors import InvalidRequest

Body = TypeVar("Body", bound=MutableMapping[str, Any])


def is_bare(text: Any) -> bool:
    return isinstance(text, str) and bool(TIER_RE.match(text))


def node_of(text: Any) -> str | None:
    """The node a full device names (`node1:disk` -> node1); None for anything else (bare, auto, an address)."""
    if not isinstance(text, str) or text == AUTO or text.startswith(AUTO + ":") or is_bare(text):
        return None
    try:
        return Device.parse(text).node
    except InvalidRequest:
        return None  # an address (`10.0.0.5:gpu0`) or a mistake: the view's own parsing names it


def bare(text: Any, field: str, node: str | None = None) -> Any:
    """`gpu0` -> `<node>:gpu0` with a node known, else `auto:gpu` (`disk` -> `auto:disk`); anything else as it is."""
    if not is_bare(text):
        return text
    if node is not None:
        return str(Device.parse(text, field=field, default_node=node))
    return f"{AUTO}:{'gpu' if text.startswith('gpu') else text}"


def resolve(args: Body, *fields: str, node: str | None = None) -> Body:
    """Resolve the bare tiers among `fields` of a request body in place: each takes `node`, else the node another of
    the fields names (a move's `source_device: node1:disk` with `target_device: gpu0` is node1's GPU 0), else
    becomes `auto:<tier>`."""
    known = node or next((n for f in fields if (n := node_of(args.get(f))) is not None), None)
    for f in fields:
        if is_bare(args.get(f)):
            mine = bare(args[f], f, known)
            # never the very device another field names (`disk` -> `node2:disk` copied to itself): then any
            others = [args.get(g) for g in fields if g != f]
            args[f] = mine if mine not in others else bare(args[f], f)
    return args


def ends(args: Body) -> Body:
    """`resolve` for a copy's or move's `source_device` and `target_device`."""
    return resolve(args, "source_device", "target_device")
