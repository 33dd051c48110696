"""The original's service config: the service's own keys apart from the preset's parameters, vLLM under the
original's parameter names, and the gateway's round robin."""

from __future__ import annotations

import pytest

from gswarm_tasks.errors import InvalidRequest
from gswarm_tasks.serving.engines import DEFAULTS, choose
from gswarm_tasks.settings import Settings
from gswarm_web.control.serving.config import engine_config, split_config
from gswarm_web.control.serving.table import Directory, Target

VALUES = {"path": "/m", "host": "10.0.0.1", "port": "8080", "model": "llama-7b", "python": "python"}


def test_the_originals_config_splits_into_the_services_keys_and_the_presets() -> None:
    config = {
        "port": 8080,
        "replicas": 2,
        "load_balancing": "round_robin",
        "max_batch_size": 32,
        "timeout": 30,
    }
    engine, own = split_config(config)
    assert engine == {"max_batch_size": 32}
    assert own == {"port": 8080, "replicas": 2, "load_balancing": "round_robin", "timeout": 30}
    assert engine_config({**config, "nodes": ["node1"]}) == {"max_batch_size": 32}


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"load_balancing": "random"}, "config.load_balancing"),
        ({"timeout": 0}, "config.timeout"),
        ({"timeout": True}, "config.timeout"),
        ({"port": 80}, "config.port"),
        ({"replicas": 0}, "config.replicas"),
        ({"nodes": ["node1"]}, "config.nodes"),
    ],
)
def test_a_bad_service_key_is_refused_naming_it(config: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        split_config(config)
    assert err.value.details["field"] == field


def test_vllm_takes_the_originals_parameter_names_as_its_own_flags() -> None:
    config = {
        "framework": "vllm",
        "max_batch_size": 32,
        "max_sequence_length": 2048,
        "gpu_memory_fraction": 0.9,
    }
    engine, params = choose(config, DEFAULTS)
    assert engine == "vllm"
    argv = DEFAULTS["vllm"].command(VALUES, params)
    assert argv[-6:] == ["--max-num-seqs", "32", "--max-model-len", "2048", "--gpu-memory-utilization", "0.9"]
    for bad in (0, 1.5, "0.9", True):
        with pytest.raises(InvalidRequest, match="config.gpu_memory_fraction"):
            choose({"framework": "vllm", "gpu_memory_fraction": bad}, DEFAULTS)


def test_round_robin_takes_each_replica_in_turn_and_least_requests_the_idle_one() -> None:
    d = Directory(None, None, Settings())  # no database read, no Redis: this process's own counts
    targets = [Target(f"r{i}", "s", f"http://10.0.0.{i}:8080") for i in range(3)]
    d.by_model, d.policy = {"m": targets}, {"m": "round_robin"}
    d.in_flight = {"r0": 5}  # round robin pays no attention to what is in flight
    picked = [d.pick("m", set(), refresh=False) for _ in range(6)]
    assert [t.replica_id for t in picked if t] == ["r0", "r1", "r2", "r0", "r1", "r2"]
    d.policy = {"m": "least_requests"}
    d.in_flight = {"r0": 5, "r1": 0, "r2": 3}
    best = d.pick("m", set(), refresh=False)
    assert best is not None and best.replica_id == "r1"
    assert d.pick("m", {"r0", "r1", "r2"}, refresh=False) is None
