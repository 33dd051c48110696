"""The engines' own metrics (`vllm:*`, `llamacpp:*`, `sglang:*`, `tgi_*`) on gswarm's `/metrics`, as Prometheus
federation would show them: every sample of the engines' own families in every replica's last scrape, labelled with
its `service`, `model` and `replica` (the servers' generic families, `process_*`, `python_*`, `http_*`, are left
out: they say nothing of the engine, and other exporters use the same names).

A node scrapes its replicas' metrics with their health checks (`serving/replicas.py`) and keeps the text in Redis;
here each replica's text is parsed once per scrape (prometheus_client's parser) and written again with those
labels; one HELP and TYPE per family over all replicas. A replica not scraped for STALE_S is left out.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from gswarm_tasks import names
from gswarm_tasks.serving.engines import ENGINE_METRICS

from ...extensions import db
from ...tables import Model, Replica, Service

log = logging.getLogger(__name__)

STALE_S = 60.0
_parsed: dict[
    str, tuple[float, list[Any]]
] = {}  # replica -> (scraped at, its families): parsed once per scrape


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _families(replica: str, at: float, text: str) -> list[Any]:
    hit = _parsed.get(replica)
    if hit is not None and hit[0] == at:
        return hit[1]
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as exc:  # a broken scrape: left out, said once per scrape
        log.warning("engine metrics of replica %s cannot be parsed: %s", replica, exc)
        families = []
    _parsed[replica] = (at, families)
    return families


def scrapes(client: redis.Redis, replicas: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The fresh scrapes by replica id (of `replicas`, else of all): {"at", "text", "node"}."""
    try:
        if replicas is None:
            raw: dict[bytes, bytes] = client.hgetall(names.ENGINE_METRICS_KEY)  # type: ignore[assignment]
        else:
            got: list[bytes | None] = client.hmget(names.ENGINE_METRICS_KEY, replicas) if replicas else []  # type: ignore[assignment]
            raw = {r.encode(): v for r, v in zip(replicas, got, strict=True) if v is not None}
    except redis.RedisError:
        return {}
    now, out = time.time(), {}
    for key, value in raw.items():
        try:
            doc = json.loads(value)
        except ValueError:
            continue
        if (
            isinstance(doc, dict)
            and now - float(doc.get("at") or 0) < STALE_S
            and isinstance(doc.get("text"), str)
        ):
            out[key.decode()] = doc
    return out


# The gauges of requests an engine holds in its own queue (it has taken them, but not into a batch yet).
QUEUES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")


def engine_waiting(client: redis.Redis, replicas: list[str], fresh_s: float) -> float | None:
    """Requests waiting in the engines' own queues over `replicas`, from scrapes younger than `fresh_s` (None: no
    replica reports a queue)."""
    found = scrapes(client, replicas)
    total, reported = 0.0, False
    now = time.time()
    for replica in replicas:
        doc = found.get(replica)
        if doc is None or now - float(doc["at"]) > fresh_s:
            continue
        for fam in _families(replica, float(doc["at"]), doc["text"]):
            if fam.name in QUEUES:
                total += sum(float(sample.value) for sample in fam.samples)
                reported = True
    return total if reported else None


def engine_text(client: redis.Redis) -> str:
    """Every fresh replica's engine metrics with service, model and replica labels (Prometheus text format)."""
    found = scrapes(client)
    if not found:
        return ""
    rows = db.session.execute(
        db.select(Replica.id, Replica.service_id, Model.name)
        .join(Service, Replica.service_id == Service.id)
        .join(Model, Service.model_id == Model.id)
        .where(Replica.id.in_(list(found)))
    ).all()
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, service, model in rows:
        doc = found[replica]
        extra = {"service": service, "model": model, "replica": replica}
        for fam in _families(replica, float(doc["at"]), doc["text"]):
            if not fam.name.startswith(ENGINE_METRICS):  # a node keeps only these; an older one kept all
                continue
            kind, help_, lines = families.setdefault(fam.name, (fam.type, fam.documentation, []))
            for sample in fam.samples:
                labels = {**sample.labels, **extra}
                text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                lines.append(f"{sample.name}{{{text}}} {float(sample.value)!r}")
    out = []
    for name, (kind, help_, lines) in families.items():
        out.append(f"# HELP {name} {_escape(help_)}\n# TYPE {name} {kind}\n" + "\n".join(lines) + "\n")
    return "".join(out)
