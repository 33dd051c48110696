"""models.cache_size on a real node: a download or a copy that would pass it fails clearly and keeps nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.fleet import Fleet, running_fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("quota")
    src = tmp / "src"
    for name, size in (("small", 1 << 20), ("large", 3 << 20)):
        (src / name).mkdir(parents=True)
        (src / name / "w.bin").write_bytes(os.urandom(size))
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(src), "GSWARM_MODELS_CACHE_SIZE": str(2 << 20)}
    with running_fleet(tmp, nodes=("node1",), extra_env=env) as f:
        f.src = src  # type: ignore[attr-defined]
        yield f


def test_a_download_past_the_cache_size_fails_and_keeps_nothing(fleet: Fleet) -> None:
    src: Path = fleet.src  # type: ignore[attr-defined]
    fleet.register_and_download("small", f"file://{src / 'small'}")
    body = {"model_name": "large", "model_type": "llm", "source_url": f"file://{src / 'large'}"}
    code, _ = fleet.post("/models", body)
    assert code == 201
    code, body = fleet.post("/models/large/download", {"target_device": "node1:disk"})
    assert code == 202, body
    task = fleet.wait_task(body["task_id"])
    assert task["status"] == "failed" and task["error"]["code"] == "RESOURCE_UNAVAILABLE", task
    assert "models.cache_size" in task["error"]["message"]
    model = fleet.get("/models/large")[1]
    assert model["locations"] == [] and "models.cache_size" in model["status_message"]
    assert not (fleet.storage("node1") / "models" / "large").exists()
    assert not any((fleet.storage("node1") / ".staging").iterdir())
    # the dram tier is not the cache: the same model fits there
    code, body = fleet.post(
        "/models/small/copy", {"source_device": "node1:disk", "target_device": "node1:dram"}
    )
    assert code == 202 and fleet.wait_task(body["task_id"])["status"] == "succeeded"
