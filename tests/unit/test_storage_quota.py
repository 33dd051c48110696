"""models.cache_size: room is taken before bytes are written, one operation at a time across processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from gswarm_tasks.errors import ResourceUnavailable
from gswarm_tasks.storage import RESERVED_FILE, install, reserve


def _model(models: Path, name: str, size: int) -> None:
    (models / name).mkdir(parents=True)
    (models / name / "w.bin").write_bytes(b"x" * size)


def test_kept_models_and_reservations_count_and_a_replaced_copy_does_not(tmp_path: Path) -> None:
    models, staging = tmp_path / "models", tmp_path / ".staging"
    _model(models, "a", 600)
    reserve(models, staging / "op1", 300, 1000, "b")  # 600 kept + 300
    with pytest.raises(ResourceUnavailable, match="models.cache_size") as err:
        reserve(models, staging / "op2", 200, 1000, "c")  # 600 + 300 reserved + 200 > 1000
    assert err.value.details["used_bytes"] == 900 and err.value.details["need_bytes"] == 200
    reserve(models, staging / "op3", 100, 1000, "c")
    reserve(models, staging / "op4", 400, 1000, "a")  # replaces a's 600: 300 + 100 + 400
    reserve(models, staging / "op5", 10**12, 0, "d")  # 0: no limit


def test_install_drops_the_reservation(tmp_path: Path) -> None:
    staging, final = tmp_path / ".staging" / "op", tmp_path / "models" / "m"
    reserve(tmp_path / "models", staging, 3, 10, "m")
    (staging / "w.bin").write_bytes(b"abc")
    install(staging, final, {"files": [{"path": "w.bin", "size": 3}]})
    assert (final / "w.bin").read_bytes() == b"abc" and not (final / RESERVED_FILE).exists()


def _take(args: tuple[str, str]) -> bool:
    root, op = args
    try:
        reserve(Path(root) / "models", Path(root) / ".staging" / op, 600, 1000, op)
        return True
    except ResourceUnavailable:
        return False


def test_two_processes_never_both_take_the_last_room(tmp_path: Path) -> None:
    for round_ in range(5):
        root = tmp_path / str(round_)
        with multiprocessing.get_context("fork").Pool(4) as pool:
            taken = pool.map(_take, [(str(root), f"op{i}") for i in range(4)])
        assert sum(taken) == 1, taken
