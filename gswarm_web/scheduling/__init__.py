"""Scheduling: model-aware placement of workflow steps on GPUs, shared by the simulator and live placement.

Pure Python (no Celery, Flask or database): the fleet and cost model (`fleet`, `cluster`), policies behind one
interface (`policies`), an event-driven simulator, a validator for any policy's output, and a trace generator.
"""

from __future__ import annotations

from .api import prepare, run, simulate_payload, validate_payload
from .config import Config, ModelSpec, load_config, parse_config
from .fleet import Fleet, load_fleet, parse_fleet
from .live import fleet_from_view, fleet_view
from .policies import DEFAULT_POLICY, POLICIES, PUBLIC_POLICIES, Policy, make_policy
from .simulator import PolicyError, Simulation, simulate
from .validator import Violation, validate
from .workload import MODES, Workload, parse_requests

__all__ = [
    "DEFAULT_POLICY",
    "MODES",
    "POLICIES",
    "PUBLIC_POLICIES",
    "Config",
    "Fleet",
    "ModelSpec",
    "Policy",
    "PolicyError",
    "Simulation",
    "Violation",
    "Workload",
    "fleet_from_view",
    "fleet_view",
    "load_config",
    "load_fleet",
    "make_policy",
    "parse_config",
    "parse_fleet",
    "parse_requests",
    "prepare",
    "run",
    "simulate",
    "simulate_payload",
    "validate",
    "validate_payload",
]
