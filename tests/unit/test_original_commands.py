"""Every command line of the original documents (/work/shared/seeds: the gswarm README's Quick Start and CLI
reference, the gsmodel and gsprof READMEs, the design document's unified CLI), copied verbatim (placeholders
filled in), is a command gswarm's CLI knows with the options and arguments it takes; a command of the gRPC era
prints what to type now and exits 2. The integration tests (test_quick_start, test_model_cli,
test_profiler_archive, test_original_workflows, test_original_rest) run them on a real fleet."""

from __future__ import annotations

import shlex
from typing import Any

import click
import pytest
from click.testing import CliRunner

from gswarm_web.cli import main as gswarm
from gswarm_web.cli.original.gsmodel import MAPPED
from gswarm_web.cli.original.gsmodel import main as gsmodel
from gswarm_web.cli.original.gsprof import main as gsprof

GSWARM = [
    # README: Quick Start
    "gswarm host start --port 8090 --http-port 8091 --model-port 9010",
    "gswarm client connect 10.0.0.5:8090 --resilient",
    "gswarm profiler start --name training_run",
    "gswarm profiler status",
    "gswarm profiler stop --name training_run",
    "gswarm model list",
    "gswarm model download llama-7b --source huggingface --url https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct"
    " --node node1 --type llm",
    "gswarm model download llama-7b --source hf://meta-llama/Llama-3.1-8B-Instruct --node node1 --type llm",
    "gswarm model download llama-7b --source huggingface --url https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct"
    " --type llm",
    "gswarm model download llama-7b --source hf://meta-llama/Llama-3.1-8B-Instruct --type llm",
    "gswarm model move llama-7b --from disk --to gpu0",
    "gswarm model move llama-7b --from disk --to gpu0 --node node1",
    "gswarm model serve llama-7b --device gpu0 --port 8080",
    "gswarm model serve llama-7b --device gpu0 --port 8080 --node node1",
    "gswarm model status llama-7b",
    "gswarm model status llama-7b --node node1",
    "gswarm data create --source s3://bucket/data --device dram",
    "gswarm data list",
    "gswarm data transfer chunk-123 --to node2:dram",
    # README: CLI reference
    "gswarm host start --port 8090 --http-port 8091",
    "gswarm host stop",
    "gswarm host status",
    "gswarm status",
    "gswarm nodes",
    "gswarm health",
    "gswarm profiler start --name n1 --freq 500",
    "gswarm profiler start",
    "gswarm profiler stop --name n1",
    "gswarm profiler stop",
    "gswarm profiler sessions",
    "gswarm profiler recover",
    "gswarm profiler analyze --data run.json --plot run.pdf",
    "gswarm model list --location node1:disk",
    "gswarm model info llama-7b",
    "gswarm model register llama-7b --type llm --source hf://meta-llama/Llama-3.1-8B-Instruct",
    "gswarm model download llama-7b --device node1:disk",
    "gswarm model download llama-7b",
    "gswarm model move llama-7b --from node1:disk --to node1:dram --keep-source",
    "gswarm model copy llama-7b --from node1:disk --to node2:disk",
    "gswarm model delete llama-7b --device node2:disk",
    "gswarm model serve llama-7b --device node1:gpu0 --port 8080",
    "gswarm model serve llama-7b --device gpu0",
    "gswarm model stop llama-7b",
    "gswarm model services",
    "gswarm data list --device node1:dram",
    "gswarm data create --source s3://bucket/data",
    "gswarm data info chunk-123",
    "gswarm data move chunk-123 --to disk",
    "gswarm data transfer chunk-123 --to node2",
    "gswarm data delete chunk-123",
    "gswarm queue status",
    "gswarm queue tasks",
    "gswarm queue tasks --status completed",
    "gswarm queue cancel task-456",
    "gswarm queue history --limit 20",
    # README: Monitoring and Troubleshooting
    "gswarm node status node1",
    "gswarm model service-health llama-7b",
    # the design document's unified CLI
    "gswarm profiler report",
]

GSMODEL = [
    "gsmodel register llama-7b --type llm --url https://huggingface.co/meta-llama/Llama-2-7b-hf"
    ' --desc "Llama 2 7B language model"',
    "gsmodel list --verbose",
    "gsmodel list",
    "gsmodel info llama-7b",
    "gsmodel unregister llama-7b --force",
    "gsmodel job examples/simple-deployment.yaml --wait",
    "gsmodel jobs --status running",
    "gsmodel job-status 5b0e --verbose",
    "gsmodel example --output examples/",
    "gsmodel status",
    "gsmodel nodes --verbose",
]
GSMODEL_MOVED = [
    "gsmodel generate-grpc",
    "gsmodel start --host 0.0.0.0 --port 8090 --http-port 8080",
    "gsmodel start --background --port 8090 --http-port 8080",
    "gsmodel start --data-dir /path/to/data",
    "gsmodel connect 192.168.1.100:8090 --node-id gpu-worker-01",
]
GSPROF_MOVED = [
    "gsprof start --port 8090 --http-port 8091 --enable-bandwidth --freq 1000",
    "gsprof start --port 8090 --http-port 0 --enable-bandwidth --freq 1000",
    "gsprof connect master-node:8090 --resilient",
    "gsprof profile head:8090 --name my_experiment",
    "gsprof http-profile master-node:8091 --name training_run_1",
    "gsprof http-status head:8091",
    "gsprof http-stop master-node:8091 --name training_run_1",
    "gsprof http-stop localhost:8091",
]
GSPROF = [
    "gsprof status head:8090",
    "gsprof stop head:8090 --name my_experiment",
    "gsprof stop head:8090",
    "gsprof recover --list",
    "gsprof recover --name my_experiment",
    "gsprof recover --session-id my_experiment",
    "gsprof recover --export --name my_experiment",
    "gsprof stat --data training_run_1.json --plot training_run_1.pdf",
]


@pytest.fixture(autouse=True)
def files_the_lines_name(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("run.json", "training_run_1.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "simple-deployment.yaml").write_text("name: x\n")


def resolve(root: click.Command, argv: list[str]) -> click.Command:
    """Parse `argv` the way click would before running anything: every group picks its subcommand, every command
    its options and arguments (unknown ones and missing values raise click's usage errors). Returns the command."""
    ctx = root.make_context(root.name or "cli", list(argv), resilient_parsing=False)
    cmd = root
    while isinstance(cmd, click.Group):
        name, sub, rest = cmd.resolve_command(ctx, [*ctx.protected_args, *ctx.args])
        assert sub is not None, argv
        ctx = sub.make_context(name or "", rest, parent=ctx)
        cmd = sub
    return cmd


@pytest.mark.parametrize("line", GSWARM)
def test_the_originals_gswarm_command_lines_parse(line: str) -> None:
    resolve(gswarm, shlex.split(line)[1:])


@pytest.mark.parametrize("line", GSMODEL)
def test_gsmodel_commands_are_gswarm_commands(line: str) -> None:
    verb, *rest = shlex.split(line)[1:]
    target = MAPPED[verb]
    resolve(gsmodel, [verb, *rest])
    if verb == "unregister":  # gswarm model delete takes --force; gsmodel's unregister is the whole model
        rest = [a for a in rest if a != "--force"]
    resolve(gswarm, [*target, *rest])


@pytest.mark.parametrize("line", GSPROF)
def test_gsprof_commands_parse(line: str) -> None:
    resolve(gsprof, shlex.split(line)[1:])


@pytest.mark.parametrize("line", GSMODEL_MOVED + GSPROF_MOVED)
def test_grpc_era_commands_say_what_to_type_now(line: str) -> None:
    prog, *argv = shlex.split(line)
    result = CliRunner().invoke(gsmodel if prog == "gsmodel" else gsprof, argv)
    assert result.exit_code == 2, result.output
    assert "gswarm " in result.output and "Traceback" not in result.output, result.output
