"""`gswarm schedule`: generate, simulate, validate and plot from the command line, with the documented exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gswarm_web.cli.schedule import schedule

DATA = Path(__file__).parent / "scheduling_data"


@pytest.fixture
def traced(tmp_path: Path) -> Path:
    """A generated config and trace in `tmp_path` (c.json, r.yaml)."""
    result = CliRunner().invoke(
        schedule,
        ["generate", "--write-config", str(tmp_path / "c.json"), "--output", str(tmp_path / "r.yaml")]
        + ["--count", "60", "--gpus", "4", "--utilization", "0.8", "--burst", "3", "--seed", "5"],
    )
    assert result.exit_code == 0, result.output
    return tmp_path


def simulate(tmp: Path, policy: str, mode: str = "online") -> Path:
    out = tmp / f"{policy}-{mode}.json"
    result = CliRunner().invoke(
        schedule,
        ["simulate", "--config", str(tmp / "c.json"), "--requests", str(tmp / "r.yaml"), "--gpus", "4"]
        + ["--policy", policy, "--mode", mode, "--output", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert policy in result.output  # the summary table
    return out


def validate(tmp: Path, schedule_file: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        schedule,
        ["validate", "--config", str(tmp / "c.json"), "--requests", str(tmp / "r.yaml"), "--gpus", "4"]
        + [str(schedule_file)],
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("policy", ["fifo", "round_robin", "offline", "online", "gswarm"])
def test_simulated_schedules_validate(traced: Path, policy: str, mode: str) -> None:
    out = simulate(traced, policy, mode)
    code, text = validate(traced, out)
    assert code == 0, text
    assert "valid" in text and mode in text


def test_a_corrupted_schedule_exits_1_and_says_why(traced: Path) -> None:
    out = simulate(traced, "gswarm")
    doc = json.loads(out.read_text())
    doc["summary"]["model_loads"] += 1
    doc["executions"].pop()
    out.write_text(json.dumps(doc))
    code, text = validate(traced, out)
    assert code == 1
    assert "never ran" in text and "model_loads" in text and "invalid" in text


def test_bad_input_exits_2_naming_the_field(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        schedule,
        [
            "simulate",
            "--config",
            str(DATA / "dangling_config.json"),
            "--requests",
            str(DATA / "hand_requests.yaml"),
        ]
        + ["--gpus", "2"],
    )
    assert result.exit_code == 2
    assert "config.workflows.code_analysis.edges[1].from" in result.output
    result = CliRunner().invoke(
        schedule,
        [
            "simulate",
            "--config",
            str(DATA / "tiny_config.json"),
            "--requests",
            str(DATA / "hand_requests.yaml"),
        ],
    )
    assert result.exit_code == 2 and "gpus" in result.output


def test_the_original_files_simulate_on_a_fleet(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        schedule,
        [
            "simulate",
            "--config",
            str(DATA / "tiny_config.json"),
            "--requests",
            str(DATA / "original_requests.yaml"),
        ]
        + ["--fleet", str(DATA / "fleet.yaml"), "--output", "-"],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["summary"]["steps"] == 6
    assert {e["loaded_from"] for e in doc["executions"]} <= {"gpu", "dram", "disk", "peer", "hub"}


def test_plot_draws_schedules_side_by_side(traced: Path) -> None:
    fifo, ours = simulate(traced, "fifo"), simulate(traced, "gswarm")
    png = traced / "gantt.png"
    result = CliRunner().invoke(schedule, ["plot", str(fifo), str(ours), "-o", str(png), "--until", "300"])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generate_writes_the_original_trace_format_to_stdout() -> None:
    result = CliRunner().invoke(
        schedule, ["generate", "--count", "3", "--workflow", "code_review", "--seed", "1"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("requests:\n- request_id: req_00000\n")
    assert "node_execution_times:" in result.output and "workflow_id: code_review" in result.output
    bad = CliRunner().invoke(schedule, ["generate", "--workflow", "nope"])
    assert bad.exit_code == 2
