"""Plain functions the CLI and the HTTP layer share: build a workload on a fleet, simulate, validate."""

from __future__ import annotations

from typing import Any

from .config import Config, parse_config
from .fields import choice, integer, mapping, refuse
from .fleet import Fleet, parse_fleet
from .policies import DEFAULT_POLICY, PUBLIC_POLICIES, make_policy
from .simulator import simulate
from .validator import validate
from .workload import MODES, Workload, parse_requests

SIMULATE_FIELDS = ("config", "requests", "gpus", "fleet", "policy", "mode")
VALIDATE_FIELDS = ("config", "requests", "gpus", "fleet", "mode", "schedule")


def prepare(
    config: Config, requests: Any, gpus: int | None, fleet: Fleet | None, mode: str
) -> tuple[Workload, Fleet]:
    """The trace's steps in `mode` and the fleet to run them on (`gpus` GPUs on one node when no fleet is given)."""
    workload = Workload(config, parse_requests(requests, config), mode)
    if fleet is None:
        if gpus is None:
            raise refuse("gpus", "the number of GPUs is required without a fleet")
        fleet = Fleet.single_node(gpus)
    elif gpus is not None and gpus != fleet.gpus:
        raise refuse("gpus", f"{gpus} given, the fleet has {fleet.gpus} GPUs", gpus)
    fleet.check_config(
        config, {m.name for m in workload.models}, "fleet" if not fleet.uniform else "GPUs given"
    )
    return workload, fleet


def run(workload: Workload, fleet: Fleet, policy: str = DEFAULT_POLICY, **options: Any) -> dict[str, Any]:
    """Simulate `policy` (any registered one, `eft` included) and return the OUT.json document."""
    return simulate(workload, fleet, make_policy(policy, **options))


def _unknown(doc: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            raise refuse(key, f"unknown field (expected one of {', '.join(allowed)})")


def _inputs(doc: dict[str, Any], mode: str) -> tuple[Workload, Fleet]:
    config = parse_config(doc.get("config"))
    gpus = None if doc.get("gpus") is None else integer(doc["gpus"], "gpus", minimum=1)
    fleet = None if doc.get("fleet") is None else parse_fleet(doc["fleet"])
    if doc.get("requests") is None:
        raise refuse("requests", "the request trace is required")
    return prepare(config, doc["requests"], gpus, fleet, mode)


def simulate_payload(doc: Any) -> dict[str, Any]:
    """`POST /scheduling/simulate`: {config, requests, gpus, fleet?, policy?, mode?} -> the OUT.json document."""
    body = mapping(doc, "body")
    _unknown(body, SIMULATE_FIELDS)
    policy = choice(body.get("policy"), "policy", PUBLIC_POLICIES, default=DEFAULT_POLICY)
    mode = choice(body.get("mode"), "mode", MODES, default="online")
    workload, fleet = _inputs(body, mode)
    return run(workload, fleet, policy)


def validate_payload(doc: Any) -> dict[str, Any]:
    """{config, requests, gpus, fleet?, mode?, schedule} -> {valid, violations: [{check, message}]}."""
    body = mapping(doc, "body")
    _unknown(body, VALIDATE_FIELDS)
    schedule = mapping(body.get("schedule"), "schedule")
    summary = schedule.get("summary")
    summary = summary if isinstance(summary, dict) else {}
    mode = choice(body.get("mode", summary.get("mode")), "mode", MODES, default="online")
    workload, fleet = _inputs(body, mode)
    found = validate(schedule, workload, fleet, mode)
    return {"valid": not found, "violations": [{"check": v.check, "message": v.message} for v in found]}
