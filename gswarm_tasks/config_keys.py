"""The config file's shape: every key is a setting (else one error naming it and what to use), and `nodes:` declares
the nodes the fleet expects (shown as `missing` until they join)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .devices import validate_node_name
from .errors import ConfigError, InvalidRequest

NODES_KEY = "nodes"
NODE_KEYS = ("name", "address", "capabilities")
CAPABILITY_KEYS = ("gpus", "storage")
STORAGE_KEYS = ("disk", "dram")
_GPU_RE = re.compile(r"^gpu(0|[1-9][0-9]{0,2})$")


def _tree(paths: Iterable[str]) -> dict[str, Any]:
    """`a.b.c` paths as nested dicts; a leaf (a setting) is None."""
    tree: dict[str, Any] = {NODES_KEY: None}
    for path in paths:
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = None
    return tree


def _unknown(path: str, key: str, siblings: Iterable[str], source: str) -> ConfigError:
    known = sorted(siblings)
    close = difflib.get_close_matches(key, known, n=1)
    hint = (
        f" (did you mean {path.rsplit('.', 1)[0] + '.' if '.' in path else ''}{close[0]}?)" if close else ""
    )
    where = f"`{path.rsplit('.', 1)[0]}` takes" if "." in path else "the top level takes"
    return ConfigError(
        f"{source}: {path} is not a gswarm setting{hint}; {where}: {', '.join(known)} (docs/reference/settings.md)",
        {"field": path},
    )


def check_keys(doc: Mapping[str, Any], paths: Iterable[str], source: str) -> None:
    """Refuse any key of `doc` that is not a setting's path (or a section holding some), naming it."""

    def walk(part: Mapping[str, Any], tree: dict[str, Any], prefix: str) -> None:
        for key, value in part.items():
            path = f"{prefix}{key}"
            if not isinstance(key, str) or key not in tree:
                raise _unknown(path, str(key), tree, source)
            sub = tree[key]
            if sub is None:
                continue
            if value is None:
                continue  # an empty section (`queue:` with everything commented out)
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"{source}: {path} must be a section (of {', '.join(sorted(sub))}), not {type(value).__name__}",
                    {"field": path},
                )
            walk(value, sub, f"{path}.")

    walk(doc, _tree(paths), "")


def _only(entry: Mapping[str, Any], allowed: tuple[str, ...], path: str, source: str) -> None:
    for key in entry:
        if key not in allowed:
            raise _unknown(f"{path}.{key}", str(key), allowed, source)


def _size(value: Any, path: str, source: str, parse_size: Any) -> int:
    try:
        n = int(parse_size(value))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {path}: {exc} (bytes, or like `500GB`)", {"field": path}) from exc
    if n < 0:
        raise ConfigError(f"{source}: {path}: a size is not negative", {"field": path})
    return n


def _capabilities(caps: Any, path: str, source: str, parse_size: Any) -> dict[str, Any]:
    if caps is None:
        return {}
    if not isinstance(caps, Mapping):
        raise ConfigError(f"{source}: {path} must be a mapping (gpus, storage)", {"field": path})
    _only(caps, CAPABILITY_KEYS, path, source)
    out: dict[str, Any] = {}
    gpus = caps.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or not all(isinstance(g, str) and _GPU_RE.match(g) for g in gpus):
            raise ConfigError(
                f"{source}: {path}.gpus must be a list like [gpu0, gpu1]", {"field": f"{path}.gpus"}
            )
        if len(set(gpus)) != len(gpus):
            raise ConfigError(f"{source}: {path}.gpus names a GPU twice", {"field": f"{path}.gpus"})
        out["gpus"] = list(gpus)
    storage = caps.get("storage")
    if storage is not None:
        if not isinstance(storage, Mapping):
            raise ConfigError(
                f"{source}: {path}.storage must be a mapping (disk, dram)", {"field": f"{path}.storage"}
            )
        _only(storage, STORAGE_KEYS, f"{path}.storage", source)
        out["storage"] = {k: _size(v, f"{path}.storage.{k}", source, parse_size) for k, v in storage.items()}
    return out


def parse_nodes(nodes: Any, source: str, parse_size: Any) -> list[dict[str, Any]]:
    """The `nodes:` list as checked dicts: name (a node name, once), address, capabilities (gpus, storage)."""
    if nodes is None:
        return []
    if not isinstance(nodes, list):
        raise ConfigError(
            f"{source}: `nodes` must be a list of nodes (name, address, capabilities)", {"field": "nodes"}
        )
    out: list[dict[str, Any]] = []
    for i, node in enumerate(nodes):
        path = f"nodes[{i}]"
        if not isinstance(node, Mapping) or "name" not in node:
            raise ConfigError(f"{source}: {path}.name is required (a node name)", {"field": f"{path}.name"})
        _only(node, NODE_KEYS, path, source)
        try:
            name = validate_node_name(node["name"], f"{path}.name")
        except InvalidRequest as exc:
            raise ConfigError(f"{source}: {exc.message}", {"field": f"{path}.name"}) from exc
        if any(n["name"] == name for n in out):
            raise ConfigError(f"{source}: {path}.name: {name} is declared twice", {"field": f"{path}.name"})
        address = node.get("address")
        if address is not None and (
            not isinstance(address, str) or not address.strip() or len(address) > 255
        ):
            raise ConfigError(
                f"{source}: {path}.address must be a host name or address", {"field": f"{path}.address"}
            )
        entry: dict[str, Any] = {"name": name, "address": address}
        entry["capabilities"] = _capabilities(
            node.get("capabilities"), f"{path}.capabilities", source, parse_size
        )
        out.append(entry)
    return out
