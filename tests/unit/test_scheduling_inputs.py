"""Scheduling inputs: the original's config and trace formats load, the fleet file and live view parse, and every
kind of mistake is refused naming its field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gswarm_tasks.errors import InvalidRequest
from gswarm_web.scheduling import (
    Fleet,
    Workload,
    fleet_from_view,
    fleet_view,
    load_config,
    load_fleet,
    parse_config,
)
from gswarm_web.scheduling.api import prepare
from gswarm_web.scheduling.fleet import GB, parse_fleet
from gswarm_web.scheduling.workload import parse_requests

DATA = Path(__file__).parent / "scheduling_data"


def tiny() -> dict[str, Any]:
    return json.loads((DATA / "tiny_config.json").read_text())


def refused(fn: Any, *args: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args)
    return info.value


def test_original_formats_load_with_execution_times_given_and_derived() -> None:
    config = load_config(DATA / "tiny_config.json")
    reqs = parse_requests(yaml.safe_load((DATA / "original_requests.yaml").read_text()), config)
    # sorted by arrival, seconds from the first request; an unquoted YAML timestamp reads the same as a quoted one
    assert [r.request_id for r in reqs] == ["req_0000", "req_0002", "req_0001"]
    assert reqs[0].arrival == 0
    assert reqs[1].arrival == pytest.approx(1.337996)
    assert reqs[2].arrival == pytest.approx(7.1071)
    assert reqs[0].seconds == (12.32, 1.3387708627483874)
    # req_0002: `a` from its node_configs tokens (100 / 50), `b` from the image model's mean inference time
    assert reqs[1].seconds == (2.0, 2.0)
    # req_0001: `y` missing, so token_mean / tokens_per_second = 200 / 50
    assert reqs[2].seconds == (10.28, 4.0)


def test_dangling_edge_is_refused_naming_workflow_and_edge() -> None:
    err = refused(load_config, DATA / "dangling_config.json")
    assert err.details["field"] == "config.workflows.code_analysis.edges[1].from"
    assert "code_analysis" in err.message and "performance_report" in err.message
    assert err.message.startswith("config.workflows.code_analysis.edges[1].from:")


def test_cycle_is_refused() -> None:
    doc = tiny()
    doc["workflows"]["chain"]["edges"].append({"from": "b", "to": "a"})
    err = refused(parse_config, doc)
    assert err.details["field"] == "config.workflows.chain.edges"
    assert "cycle" in err.message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["models"]["llm"].pop("memory_gb"), "config.models.llm.memory_gb"),
        (lambda d: d["models"]["llm"].update(gpus_required=0), "config.models.llm.gpus_required"),
        (lambda d: d["models"]["img"].update(load_time_seconds=-1), "config.models.img.load_time_seconds"),
        (lambda d: d["models"]["img"].update(load_time_seconds="10"), "config.models.img.load_time_seconds"),
        (
            lambda d: d["workflows"]["chain"]["nodes"][1].update(model="ghost"),
            "config.workflows.chain.nodes[1].model",
        ),
        (lambda d: d["workflows"]["chain"]["nodes"][1].update(id="a"), "config.workflows.chain.nodes[1].id"),
        (lambda d: d["workflows"]["pair"]["edges"][0].update(to="x"), "config.workflows.pair.edges[0]"),
        (lambda d: d.update(workflows={}), "config.workflows"),
        (lambda d: d.pop("models"), "config.models"),
    ],
)
def test_config_mistakes_name_their_field(change: Any, field: str) -> None:
    doc = tiny()
    change(doc)
    err = refused(parse_config, doc)
    assert err.details["field"] == field
    assert err.message.startswith(f"{field}:")


def request(**kw: Any) -> dict[str, Any]:
    base = {"request_id": "r", "timestamp": "2025-01-01T00:00:00", "workflow_id": "chain"}
    base["node_execution_times"] = {"a": 1.0, "b": 1.0}
    return {**base, **kw}


@pytest.mark.parametrize(
    ("requests", "field"),
    [
        ({"requests": [request(workflow_id="nope")]}, "requests.requests[0].workflow_id"),
        ({"requests": [request(timestamp="yesterday")]}, "requests.requests[0].timestamp"),
        ({"requests": [request(), request()]}, "requests.requests[1].request_id"),
        (
            {"requests": [request(node_execution_times={"a": -2, "b": 1})]},
            "requests.requests[0].node_execution_times.a",
        ),
        ({"requests": []}, "requests.requests"),
        ({"queries": []}, "requests.requests"),
    ],
)
def test_trace_mistakes_name_their_field(requests: Any, field: str) -> None:
    err = refused(parse_requests, requests, parse_config(tiny()))
    assert err.details["field"] == field


def test_an_execution_time_that_cannot_be_derived_is_refused() -> None:
    doc = tiny()
    del doc["models"]["img"]["inference_time_mean"]
    err = refused(parse_requests, {"requests": [request(node_execution_times={"a": 1})]}, parse_config(doc))
    assert err.details["field"] == "requests.requests[0].node_execution_times.b"


def test_fleet_file_gives_gpus_memory_bandwidths_and_weight_locations() -> None:
    fleet = load_fleet(str(DATA / "fleet.yaml"))
    assert fleet.node_names == ["node1", "node2"]
    assert fleet.gpus == 4 and fleet.gpu_node == [0, 0, 1, 1]
    assert fleet.gpu_memory_bytes == [80 * GB, 80 * GB, 40 * GB, 40 * GB]
    assert fleet.disk_bytes_per_s == [2 * GB, 4 * GB]
    assert fleet.gpu_name(3) == "node2:gpu1"
    config = load_config(DATA / "tiny_config.json")
    llm, img, big = (config.models[m] for m in ("llm", "img", "big"))
    assert fleet.estimate(llm, [0]) == (pytest.approx(0.7), "dram")  # 14 GB over 20 GB/s host-to-GPU
    assert fleet.estimate(llm, [2]) == (pytest.approx(14.0), "peer")  # node1 has it: 14 GB over 1 GB/s
    assert fleet.estimate(img, [3]) == (0.0, "gpu")
    assert fleet.estimate(img, [2]) == (pytest.approx(1.5), "disk")  # its 6 GB over node2's 4 GB/s disk
    assert fleet.estimate(big, [0, 1]) == (pytest.approx(120.0), "hub")  # 60 GB at 0.5 GB/s


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda f: f["nodes"][0].update(colour="red"), "fleet.nodes[0].colour"),
        (lambda f: f["nodes"][0].update(name="Node_1"), "fleet.nodes[0].name"),
        (lambda f: f["nodes"][1].update(name="node1"), "fleet.nodes[1].name"),
        (lambda f: f["nodes"][0]["gpus"].update(memory_gb=0), "fleet.nodes[0].gpus.memory_gb"),
        (lambda f: f["models"].update(llm=["node3:disk"]), "fleet.models.llm[0]"),
        (lambda f: f["models"].update(llm=["node1:gpu7"]), "fleet.models.llm[0]"),
        (lambda f: f.update(capacity="lots"), "fleet.capacity"),
        (lambda f: f["defaults"].update(disk_gb_per_s=0), "fleet.nodes[0].disk_gb_per_s"),
    ],
)
def test_fleet_mistakes_name_their_field(change: Any, field: str) -> None:
    doc = yaml.safe_load((DATA / "fleet.yaml").read_text())
    change(doc)
    err = refused(parse_fleet, doc)
    assert err.details["field"] == field


def test_a_model_no_node_can_host_is_refused_and_gpus_must_match_the_fleet() -> None:
    config = load_config(DATA / "tiny_config.json")
    trace = yaml.safe_load((DATA / "hand_requests.yaml").read_text())
    err = refused(prepare, config, trace, 1, None, "online")
    assert err.details["field"] == "config.models.big.gpus_required"
    small = parse_fleet({"nodes": [{"name": "n1", "gpus": {"count": 4, "memory_gb": 24}}]})
    err = refused(prepare, config, trace, None, small, "online")
    assert err.details["field"] == "config.models.big.gpus_required"  # 30 GB per GPU does not fit 24 GB
    err = refused(prepare, config, trace, 8, load_fleet(str(DATA / "fleet.yaml")), "online")
    assert err.details["field"] == "gpus"


def test_offline_mode_makes_every_request_available_at_zero() -> None:
    config = load_config(DATA / "tiny_config.json")
    reqs = parse_requests(yaml.safe_load((DATA / "original_requests.yaml").read_text()), config)
    assert Workload(config, reqs, "offline").arrival == [0.0, 0.0, 0.0]
    online = Workload(config, reqs, "online")
    assert online.arrival[2] > 7
    assert online.steps == 6 and online.parents[1] == (0,) and online.children[0] == [1]


LIVE_NODES = [
    {
        "name": "node1",
        "status": "healthy",
        "gpus": [
            {"index": 0, "name": "H100", "memory_total_bytes": 80 * GB, "memory_used_bytes": 14 * GB},
            {"index": 1, "name": "H100", "memory_total_bytes": 80 * GB, "memory_used_bytes": 0},
        ],
        "dram_total_bytes": 512 * GB,
        "dram_available_bytes": 400 * GB,
        "bandwidths": {"h2d_bytes_per_s": 20 * GB, "disk_bytes_per_s": 2 * GB},
    },
    {
        "name": "node2",
        "status": "offline",
        "gpus": [{"index": 0, "name": "A100", "memory_total_bytes": 40 * GB, "memory_used_bytes": 0}],
        "dram_total_bytes": 64 * GB,
        "dram_available_bytes": 60 * GB,
    },
    {
        "name": "node3",
        "status": "healthy",
        "gpus": [{"index": 0, "name": "L4", "memory_total_bytes": 24 * GB, "memory_used_bytes": 0}],
        "dram_total_bytes": 64 * GB,
        "dram_available_bytes": 60 * GB,
    },
]
LIVE_MODELS = [
    {
        "name": "llm",
        "size_bytes": 14 * GB,
        "locations": ["node1:gpu0", "node1:dram", "node1:disk", "node3:disk"],
    },
    {"name": "img", "size_bytes": 6 * GB, "locations": ["node2:disk"]},
]


def test_fleet_view_numbers_schedulable_gpus_and_lists_weights_by_tier() -> None:
    view = fleet_view(copy.deepcopy(LIVE_NODES), copy.deepcopy(LIVE_MODELS))
    assert [n["schedulable"] for n in view["nodes"]] == [True, False, True]
    assert view["gpus"] == 3
    assert [g["index"] for n in view["nodes"] for g in n["gpus"]] == [0, 1, None, 2]
    assert view["gpu_memory_free_bytes"] == (66 + 80 + 24) * GB
    assert view["models"]["llm"] == {
        "size_bytes": 14 * GB,
        "gpu": ["node1:gpu0"],
        "dram": ["node1"],
        "disk": ["node1", "node3"],
    }
    json.dumps(view)  # the API returns it as is


def test_the_fleet_of_a_view_estimates_loads_from_where_weights_are_now() -> None:
    fleet = fleet_from_view(fleet_view(LIVE_NODES, LIVE_MODELS))
    assert isinstance(fleet, Fleet) and fleet.gpus == 3 and fleet.node_names == ["node1", "node3"]
    config = parse_config(tiny())
    llm, img = config.models["llm"], config.models["img"]
    assert fleet.estimate(llm, [0]) == (0.0, "gpu")
    assert fleet.estimate(llm, [1]) == (pytest.approx(0.7), "dram")  # 14 GB over node1's 20 GB/s
    assert fleet.estimate(llm, [2])[1] == "disk"
    assert fleet.estimate(img, [0])[1] == "hub"  # its only copy is on an offline node
    # the same by name, as live placement asks it, with the size the view gives
    assert fleet.load_estimate("llm", [1]) == (pytest.approx(0.7), "dram")
    assert refused(fleet.load_estimate, "ghost", [0]).details["field"] == "model"
    assert refused(fleet.load_estimate, "llm", [0, 2]).details["field"] == "gpus"  # two nodes


def test_fleet_view_refuses_malformed_nodes_naming_the_field() -> None:
    nodes = copy.deepcopy(LIVE_NODES)
    nodes[0]["gpus"][1]["memory_total_bytes"] = "lots"
    assert refused(fleet_view, nodes, LIVE_MODELS).details["field"] == "nodes[0].gpus[1].memory_total_bytes"
    models = copy.deepcopy(LIVE_MODELS)
    models[0]["locations"] = ["node1:tape"]
    assert refused(fleet_view, LIVE_NODES, models).details["field"] == "models[0].locations[0]"
