"""/metrics from the cache: the same families and values as a build from the frames, each node's lines made again
only when its frame changes, and a new frame shown once the interval has passed."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gswarm_web.control.sessions.prometheus import MetricsCache, prometheus_text
from tests.harness.procs import wait_for


def frame(node: str, seq: int, util: float, gpus: int = 2) -> bytes:
    g = [{"index": i, "uuid": f"GPU-{node}-{i}", "name": "H100", "utilization_percent": util + i,
          "memory_used_bytes": 2**30 * (i + 1), "memory_total_bytes": 80 * 2**30, "temperature_c": 40 + i,
          "pci_bus_id": f"0000:{i:02x}:00.0"} for i in range(gpus)]  # fmt: skip
    body = {"node": node, "seq": seq, "time": time.time(), "gpus": g, "host": {"cpu_percent": 10.0 + seq}}
    return json.dumps(body).encode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.name != "gswarm_frame_age_seconds":  # moves with the clock
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class Store:
    """The stored newest frames (node -> JSON bytes), counting the reads."""

    def __init__(self, frames: dict[bytes, bytes]) -> None:
        self.frames, self.reads = frames, 0

    def read(self) -> dict[bytes, bytes]:
        self.reads += 1
        return dict(self.frames)


def test_cached_answer_has_the_same_families_and_values() -> None:
    store = Store({f"n{i}".encode(): frame(f"n{i}", 1, 10.0 * i) for i in (3, 1, 2)})
    text = MetricsCache().text(store.read)
    built = prometheus_text({k.decode(): json.loads(v) for k, v in store.frames.items()})
    assert samples(text) == samples(built) and len(samples(text)) > 0
    assert [f.name for f in text_string_to_metric_families(text)] == [
        f.name for f in text_string_to_metric_families(built)
    ]
    util = [s for s in samples(text) if s[0] == "DCGM_FI_DEV_GPU_UTIL"]
    assert [dict(labels)["instance"] for _, labels in util] == ["n1", "n1", "n2", "n2", "n3", "n3"]
    ages = next(f for f in text_string_to_metric_families(text) if f.name == "gswarm_frame_age_seconds")
    assert len(ages.samples) == 3 and all(0 <= s.value < 5 for s in ages.samples)


def test_a_new_frame_shows_after_the_interval_and_unchanged_nodes_are_kept() -> None:
    store = Store({b"n1": frame("n1", 1, 5.0), b"n2": frame("n2", 1, 7.0)})
    cache = MetricsCache(interval_s=0.3)
    first = cache.text(store.read)
    kept: Any = cache._nodes["n2"][1]
    store.frames[b"n1"] = frame("n1", 2, 55.0)
    util = ("DCGM_FI_DEV_GPU_UTIL", (("UUID", "GPU-n1-0"),))

    def value(text: str) -> float:
        return next(v for (name, labels), v in samples(text).items() if (name, labels[:1]) == util)

    assert value(cache.text(store.read)) == 5.0 and store.reads == 1  # within the interval: one read, shared
    assert value(first) == 5.0
    wait_for(lambda: value(cache.text(store.read)) == 55.0, 5, "the new frame on /metrics", interval=0.05)
    assert store.reads >= 2
    assert cache._nodes["n2"][1] is kept  # its frame did not change: its lines were not made again
    del store.frames[b"n2"]
    wait_for(
        lambda: "n2" not in cache.text(store.read), 5, "a node gone from the store gone from /metrics", 0.05
    )


def test_latest_body_is_every_frame_with_its_age() -> None:
    from gswarm_web.control.sessions.prometheus import latest_json

    raw = {b"n2": frame("n2", 4, 1.0) + b"\n", b"n1": frame("n1", 3, 2.0)}
    raw[b"odd"] = json.dumps({"time": time.time() - 2, "age_s": 99}).encode()  # a key of the answer's own
    now = time.time()
    body = json.loads(latest_json(raw, now))
    want = {k.decode(): json.loads(v) for k, v in raw.items()}
    assert list(body["nodes"]) == ["n1", "n2", "odd"]
    for node, f in want.items():
        assert body["nodes"][node] == {**f, "age_s": round(now - f["time"], 3)}
    assert 1.9 < body["nodes"]["odd"]["age_s"] < 2.1
    assert json.loads(latest_json({}, now)) == {"nodes": {}}
