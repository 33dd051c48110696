from __future__ import annotations

from pathlib import Path

import pytest

from gswarm_tasks.devices import Device, safe_name, storage_path, validate_node_name
from gswarm_tasks.errors import InvalidRequest


@pytest.mark.parametrize(
    ("text", "node", "tier", "index"),
    [
        ("node1:disk", "node1", "disk", None),
        ("node1:dram", "node1", "dram", None),
        ("gpu-host-7:gpu0", "gpu-host-7", "gpu0", None),
        ("node1:gpu12", "node1", "gpu12", None),
        ("node1:cpu", "node1", "cpu", None),
        ("node1:disk:2", "node1", "disk", 2),
        ("web", None, "web", None),
    ],
)
def test_parse_valid_devices(text: str, node: str | None, tier: str, index: int | None) -> None:
    dev = Device.parse(text)
    assert (dev.node, dev.tier, dev.index) == (node, tier, index)
    assert str(dev) == text


def test_gpu_index_and_default_node() -> None:
    dev = Device.parse("gpu3", default_node="node9")
    assert dev == Device("node9", "gpu3") and dev.is_gpu and dev.gpu_index == 3
    assert Device.parse("node1:disk").gpu_index is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "node1",
        "Node1:disk",
        "node1:tape",
        "node1:gpu",
        "node1:gpu01",
        "a:b:c:d",
        "node1:disk:x",
        ":disk",
        "control:disk",
        "-x:disk",
    ],
)
def test_parse_rejects_bad_devices_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        Device.parse(text, field="target_device")
    assert "target_device" in exc.value.message
    assert exc.value.details["field"] == "target_device"


def test_node_names() -> None:
    assert validate_node_name("node-1") == "node-1"
    for bad in ("", "UPPER", "has_underscore", "a" * 64, "celery", "-lead"):
        with pytest.raises(InvalidRequest):
            validate_node_name(bad)


@pytest.mark.parametrize("name", ["..", ".", "../etc", "a/b", "/abs", "a\\b", "x..y", "", "with space"])
def test_storage_names_that_could_escape_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidRequest):
        storage_path(tmp_path, "models", name)


def test_storage_path_builds_under_root(tmp_path: Path) -> None:
    p = storage_path(tmp_path, "models", "llama-7b")
    assert p == tmp_path.resolve() / "models" / "llama-7b"
    assert safe_name("all-MiniLM-L6-v2@main") == "all-MiniLM-L6-v2@main"
