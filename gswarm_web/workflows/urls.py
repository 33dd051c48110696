"""The URLs a workflow calls (`health_check.target_url`, `inference.service_url` / `service`): each is a URL that
`gswarm_tasks.urls` parses, or `${serve_action.service_url}` followed by a path. At submission a literal URL must be
a replica the control plane knows or a host in workflows.allowed_hosts; the step carries the origins so allowed, and
the node checks again before it connects.

A node's name is a host too, as the original documents write it (`http://node1:8080/health`): a URL naming a node
and a port means that node's model server on that port, the serve action of the workflow that starts one there
(the URL becomes `${serve.service_url}` and its path) or, failing that, a running replica of the fleet."""

from __future__ import annotations

import re
from typing import Any

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import GswarmError, InvalidRequest
from gswarm_tasks.urls import Allow, Url, parse_url, service_ref

from ..control.serving.state import LIVE
from ..extensions import db, settings
from ..tables import Node, Replica
from .actions import Errors
from .document import Action, Ref

URL_FIELDS = {"health_check": ("target_url",), "inference": ("service_url", "service")}
ENDPOINT_RE = re.compile(r"/?[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]+)*")


def _check_template(errors: Errors, actions: dict[str, Action], where: str, key: str, value: str) -> None:
    ref = service_ref(value)
    if ref is None or "${" in ref[1] or (ref[1] and not ref[1].startswith(("/", "?"))):
        errors.add(where, "a URL, or `${serve_action.service_url}` followed by a path")
        return
    step, rest = ref
    if rest:
        errors.check(where, lambda: parse_url("http://service" + rest, key))
    b = actions.get(step)
    if b is not None and b.type != "serve":
        errors.add(
            where, f"`${{{step}.service_url}}`: {step} is a {b.type} action; a URL can only come from a serve"
        )


def _check_literal(errors: Errors, where: str, key: str, value: str) -> None:
    errors.check(where, lambda: parse_url(value, key))


def _served_at(a: Action) -> tuple[str, int] | None:
    """(node, port) a serve action names: a device on a node and a literal port."""
    dev, port = a.device("device"), a.fields.get("port")
    if a.type != "serve" or not isinstance(dev, Device) or dev.node is None or not isinstance(port, int):
        return None
    return dev.node, port


def node_hosts(errors: Errors, actions: dict[str, Action]) -> dict[str, Action]:
    """`http://node1:8080/path` where a serve action of this workflow starts a server on node1 with `port: 8080`
    becomes `${that_serve.service_url}/path` (checked like any reference: the action must depend on it). Returns
    the actions so changed."""
    serves: dict[tuple[str, int], list[Action]] = {}
    for a in actions.values():
        if (at := _served_at(a)) is not None:
            serves.setdefault(at, []).append(a)
    changed: dict[str, Action] = {}
    if not serves:
        return changed
    for a in actions.values():
        for key in URL_FIELDS.get(a.type, ()):
            value = a.fields.get(key)
            if not isinstance(value, str) or "${" in value:
                continue
            try:
                url = parse_url(value, key)
            except GswarmError:
                continue  # check_url_fields names what is wrong with it
            found = serves.get((url.host, url.port), [])
            if len(found) > 1:  # the one this action waits for, if only one of them
                found = [b for b in found if b.id in a.deps] or found
            if len(found) > 1:
                where = f"actions[{a.id}].{key}"
                errors.add(where, f"{url.host}:{url.port} is served by {', '.join(b.id for b in found)}; name one "
                                  f"with ${{{found[0].id}.service_url}}")  # fmt: skip
            elif found:
                ref = Ref(found[0].id, "service_url", f"{found[0].id}.service_url")
                a = changed[a.id] = a.with_fields(
                    {key: f"{ref}{_path(url)}"}, (f"actions[{a.id}].{key}", ref)
                )
    return changed


def _path(url: Url) -> str:
    return "" if url.target == "/" else url.target


def check_url_fields(errors: Errors, actions: dict[str, Action]) -> None:
    """Each URL field is a URL the one parser accepts, or a serve action's `service_url` and a path after it."""
    for a in actions.values():
        for key in URL_FIELDS.get(a.type, ()):
            value = a.fields.get(key)
            where = f"actions[{a.id}].{key}"
            if value is None:
                continue
            if not isinstance(value, str):
                errors.add(where, "must be a URL")
            elif "${" in value:
                _check_template(errors, actions, where, key, value)
            else:
                _check_literal(errors, where, key, value)
        endpoint = a.fields.get("endpoint") if a.type == "inference" else None
        if endpoint is not None and (
            not isinstance(endpoint, str)
            or not ENDPOINT_RE.fullmatch(endpoint)
            or ".." in endpoint.split("/")
        ):
            errors.add(f"actions[{a.id}].endpoint", "must be a path such as /v1/embeddings (without `..`)")


def replica_origins() -> set[str]:
    """The origins of every replica that serves or will: the URLs `${serve.service_url}` resolves to."""
    origins = set()
    for url in db.session.scalars(
        db.select(Replica.url).where(Replica.url.is_not(None), Replica.status.in_(LIVE))
    ):
        try:
            origins.add(parse_url(url).origin)
        except GswarmError:
            continue  # a replica row with a URL the parser refuses is never a reason to allow one
    return origins


def replicas_by_node_port() -> dict[tuple[str, int], str]:
    """(node, port) -> the URL of the replica serving there (or starting), newest first wins."""
    rows = db.session.execute(
        db.select(Replica.node, Replica.port, Replica.url)
        .where(Replica.url.is_not(None), Replica.port.is_not(None), Replica.status.in_(LIVE))
        .order_by(Replica.created_at)
    )
    return {(str(node), int(port)): str(url) for node, port, url in rows}


def fleet_node_hosts(actions: tuple[Action, ...]) -> dict[str, Action]:
    """At submission: a literal URL naming a node of the fleet and a port is that node's replica on the port (its
    real address); one that names a node where nothing serves on that port is refused, saying what to write.
    Returns the actions so changed."""
    literal = [
        (a, key, parse_url(value, f"actions[{a.id}].{key}")) for a, key, value in _literal_urls(actions)
    ]
    hosts = {url.host for _, _, url in literal}
    changed: dict[str, Action] = {}
    if not literal or not hosts:
        return changed
    nodes = set(db.session.scalars(db.select(Node.name).where(Node.name.in_(hosts))))
    if not nodes:
        return changed
    replicas = replicas_by_node_port()
    allow = Allow.of(settings().workflows_allowed_hosts, "workflows.allowed_hosts")
    for a, key, url in literal:
        if url.host not in nodes or allow.permits(url):
            continue
        where = f"actions[{a.id}].{key}"
        base = replicas.get((url.host, url.port))
        if base is None:
            raise InvalidRequest(
                f"{where}: {url.host} is a node, but nothing serves on its port {url.port}: no serve action of this "
                f"workflow with `port: {url.port}` on {url.host}, and no running service there (write "
                "${<serve action>.service_url} to call the service a serve action starts)",
                {"field": where, "value": str(url)},
            )
        changed[a.id] = changed.get(a.id, a).with_fields({key: base.rstrip("/") + _path(url)})
    return changed


def _literal_urls(actions: tuple[Action, ...]) -> list[tuple[Action, str, str]]:
    """(action, field, URL) for every URL field written as a literal URL (not a reference)."""
    return [
        (a, key, value)
        for a in actions
        for key in URL_FIELDS.get(a.type, ())
        if isinstance(value := a.fields.get(key), str) and "${" not in value
    ]


def allowed_origins(actions: tuple[Action, ...]) -> dict[str, list[str]]:
    """Check every literal URL of the workflow at submission; per action, the replica origins it may reach.

    Refuses (422 naming `actions[<id>].<field>`) a URL that is neither a known replica nor in
    workflows.allowed_hosts, before anything is written."""
    literal = _literal_urls(actions)
    if not literal:
        return {}
    replicas = replica_origins()
    allow = Allow.of(settings().workflows_allowed_hosts, "workflows.allowed_hosts", replicas)
    out: dict[str, list[str]] = {}
    for a, key, value in literal:
        where = f"actions[{a.id}].{key}"
        url = parse_url(value, where)
        if not allow.permits(url):
            raise InvalidRequest(
                f"{where}: {url.origin} is neither a replica of a service nor in workflows.allowed_hosts "
                f"({allow.describe()})",
                {"field": where, "value": str(url)},
            )
        allow.check(url, where)
        if url.origin in replicas:
            out[a.id] = [url.origin]
    return out


def chosen_origins(data_extra: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The replicas submission itself pointed inferences at (`data.prepare_data`: a running service of the model)."""
    out = {}
    for aid, extra in data_extra.items():
        url = (extra.get("params") or {}).get("service_url")
        if isinstance(url, str) and "${" not in url:
            out[aid] = [parse_url(url, f"actions[{aid}].service_url").origin]
    return out
