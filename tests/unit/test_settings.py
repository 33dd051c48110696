from __future__ import annotations

from pathlib import Path

import pytest

from gswarm_tasks.errors import ConfigError
from gswarm_tasks.settings import OPTIONS, load_settings, parse_size

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "gswarm.example.yaml"


def test_defaults_live_under_home(tmp_path: Path) -> None:
    s = load_settings({"GSWARM_HOME": str(tmp_path)})
    assert s.effective_database_url == f"sqlite:///{tmp_path / 'gswarm.db'}"
    assert s.token_file == tmp_path / "token"
    assert s.effective_storage_root("node1") == tmp_path / "storage" / "node1"
    assert s.effective_api_url == "http://127.0.0.1:8091"
    assert s.api_host == "127.0.0.1"


def test_config_file_then_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cluster:\n  http_port: 9000\nqueue:\n  retry_count: 7\nmodels:\n  cache_size: 2GiB\n")
    s = load_settings(
        {"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": str(cfg), "GSWARM_QUEUE_RETRY_COUNT": "5"}
    )
    assert s.api_port == 9000
    assert s.retry_count == 5  # the environment wins over the file
    assert s.cache_size == 2 * 1024**3


def test_example_config_loads(tmp_path: Path) -> None:
    s = load_settings({"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": str(EXAMPLE)})
    assert s.profiling_frequency_ms == 1000
    assert [n["name"] for n in s.nodes] == ["node1", "node2"]
    assert s.cache_size == 100 * 10**9


def test_bad_values_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings({"GSWARM_HOME": str(tmp_path), "GSWARM_API_PORT": "eighty"})
    assert "GSWARM_API_PORT" in exc.value.message
    with pytest.raises(ConfigError):
        load_settings({"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": str(tmp_path / "missing.yaml")})


def test_visibility_timeout_must_exceed_task_timeout(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(
            {
                "GSWARM_HOME": str(tmp_path),
                "GSWARM_QUEUE_TASK_TIMEOUT": "100",
                "GSWARM_QUEUE_VISIBILITY_TIMEOUT": "100",
            }
        )
    assert "visibility_timeout" in exc.value.message


def test_sizes() -> None:
    assert parse_size("100GB") == 100 * 10**9
    assert parse_size("64GiB") == 64 * 2**30
    assert parse_size(123) == 123
    with pytest.raises(ValueError):
        parse_size("lots")


def test_the_settings_reference_lists_every_variable() -> None:
    """The docs' settings page (generated from OPTIONS by scripts/docs_reference.py) is where every variable is listed;
    tests/unit/test_docs.py checks that it is what the script makes now."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md").read_text()
    missing = [o.env for o in OPTIONS if f"| `{o.env}` |" not in page]
    assert missing == []
