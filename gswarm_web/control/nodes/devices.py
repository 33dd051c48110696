"""Devices named by a node's address (`192.168.1.100:gpu1`, as the original documents write them): the address or
host name a node announced stands for the node. `gswarm_tasks.devices.Device` stays the only parser of the syntax:
this only replaces a known address at the front of the text by the node's name."""

from __future__ import annotations

from gswarm_tasks.devices import AUTO, Device
from gswarm_tasks.errors import InvalidRequest

from ...extensions import db
from ...tables import Node


def _aliases() -> list[tuple[str, list[str]]]:
    """(address or host name, the nodes that announced it) of every known node, longest first (`10.0.0.10` before
    `10.0.0.1`)."""
    rows = db.session.execute(db.select(Node.name, Node.address, Node.hostname)).all()
    names = {name for name, _, _ in rows}
    out: dict[str, set[str]] = {}
    for name, address, host in rows:
        for alias in (address, host):
            if alias and alias not in names:  # a node's name is never another's alias
                out.setdefault(alias, set()).add(name)
    return sorted(((a, sorted(n)) for a, n in out.items()), key=lambda p: (-len(p[0]), p[0]))


def _one(alias: str, nodes: list[str], field: str) -> str:
    if len(nodes) > 1:
        raise InvalidRequest(
            f"{field}: {alias} is the address of {', '.join(nodes)}; name the node instead",
            {"field": field, "nodes": nodes},
        )
    return nodes[0]


def by_address(text: str, field: str = "device") -> str:
    """`<address>:<tier>[:<index>]` with the address (or host name) of a known node -> `<node>:<tier>[:<index>]`;
    any other text is returned as it is. An address two nodes share is refused naming `field`."""
    if not isinstance(text, str) or not text or text == "web" or text == AUTO or text.startswith(AUTO + ":"):
        return text
    try:
        Device.parse(text)
        return text  # already a node's name
    except InvalidRequest:
        pass
    for alias, nodes in _aliases():
        if text.startswith(alias + ":"):
            return _one(alias, nodes, field) + text[len(alias) :]
    return text


def named(text: str | None, field: str = "device") -> str | None:
    """`by_address` for an optional field."""
    return None if text is None else by_address(text, field)


def node_by_address(text: str, field: str = "node") -> str:
    """A node named by its name, address or host name -> its name (the text itself when none matches)."""
    if not text or db.session.get(Node, text) is not None:
        return text
    for alias, nodes in _aliases():
        if text == alias:
            return _one(alias, nodes, field)
    return text
