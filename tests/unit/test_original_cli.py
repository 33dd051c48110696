"""The original's CLI as written, where no fleet is needed: bare tiers (CLI and API), gsmodel's commands, `host
status|stop` with nothing running, `client connect`'s addresses and credentials, the original's status words."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gswarm_tasks.settings import Settings
from gswarm_web.cli import main
from gswarm_web.cli.join import broker_of
from gswarm_web.cli.local import claim_run, device_arg, local_node, record_node, release_run, running
from gswarm_web.cli.original.gsmodel import main as gsmodel
from gswarm_web.cli.up import free_port
from gswarm_web.control.nodes.targets import ends, resolve
from tests.harness.app import make_settings


@pytest.mark.parametrize(
    ("body", "fields", "node", "want"),
    [
        ({"target_device": "disk"}, ("target_device",), None, {"target_device": "auto:disk"}),
        ({"device": "gpu0"}, ("device",), None, {"device": "auto:gpu"}),
        ({"device": "dram"}, ("device",), "node3", {"device": "node3:dram"}),
        ({"device": "cpu"}, ("device",), None, {"device": "auto:cpu"}),
        # a move names its node once: the other end is on it
        ({"source_device": "node1:disk", "target_device": "gpu0"}, None, None,
         {"source_device": "node1:disk", "target_device": "node1:gpu0"}),
        ({"source_device": "disk", "target_device": "node2:gpu1"}, None, None,
         {"source_device": "node2:disk", "target_device": "node2:gpu1"}),
        ({"source_device": "disk", "target_device": "gpu0"}, None, None,
         {"source_device": "auto:disk", "target_device": "auto:gpu"}),
        # never the very device the other end names: a copy from `disk` to node2:disk takes the best disk copy
        ({"source_device": "disk", "target_device": "node2:disk"}, None, None,
         {"source_device": "auto:disk", "target_device": "node2:disk"}),
        # anything else is the view's to parse (addresses, auto, mistakes)
        ({"device": "10.0.0.5:gpu1"}, ("device",), None, {"device": "10.0.0.5:gpu1"}),
        ({"device": "auto:gpu"}, ("device",), "n", {"device": "auto:gpu"}),
        ({"device": "gpu"}, ("device",), None, {"device": "gpu"}),
    ],
)  # fmt: skip
def test_a_bare_tier_in_a_request(
    body: dict[str, Any], fields: Any, node: str | None, want: dict[str, Any]
) -> None:
    got = ends(dict(body)) if fields is None else resolve(dict(body), *fields, node=node)
    assert got == want


def settings_here(tmp_path: Path, **env: str) -> Settings:
    return make_settings(tmp_path / "home", **env)


def test_a_bare_tier_on_the_command_line_means_this_node(tmp_path: Path) -> None:
    s = settings_here(tmp_path)
    assert device_arg("gpu0", None, "--to", s) == "auto:gpu"  # no node here: placement chooses
    assert device_arg("gpu0", "node1", "--to", s) == "node1:gpu0"
    assert device_arg("node2:dram", None, "--to", s) == "node2:dram"
    record_node(Path(s.home), "here", "redis://x")  # as `client connect` does before it becomes the worker
    assert local_node(s) == "here" and device_arg("disk", None, "--from", s) == "here:disk"
    assert device_arg("disk", "node1", "--from", s) == "node1:disk"  # --node wins
    assert local_node(settings_here(tmp_path, GSWARM_NODE_NAME="named")) == "named"
    # a record whose process is gone means no node here
    doc = json.loads((Path(s.home) / "node.json").read_text())
    (Path(s.home) / "node.json").write_text(json.dumps({**doc, "created": doc["created"] - 1}))
    assert local_node(s) is None


def test_one_gswarm_per_home_and_host_status_and_stop_without_one(tmp_path: Path) -> None:
    s = settings_here(tmp_path)
    home = Path(s.home)
    home.mkdir(parents=True)
    runner = CliRunner()
    env = {"GSWARM_HOME": str(home), "GSWARM_CONFIG": ""}
    for verb in ("status", "stop"):
        r = runner.invoke(main, ["host", verb], env=env)
        assert r.exit_code == 1 and str(home) in r.output and "Traceback" not in r.output, r.output
    claim_run(home, "up")
    assert running(home)["pid"] == os.getpid()  # type: ignore[index]
    r = runner.invoke(main, ["host", "start", "--http-port", "18999"], env=env)
    assert r.exit_code == 1 and "already running" in r.output and "gswarm host stop" in r.output, r.output
    release_run(home)
    assert running(home) is None


def test_host_start_refuses_ports_that_cannot_work(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": ""}
    r = runner.invoke(main, ["host", "start", "--port", "9100", "--http-port", "9100"], env=env)
    assert r.exit_code == 2 and "--port and --http-port are both 9100" in r.output, r.output
    r = runner.invoke(
        main, ["host", "start", "--port", "8090"], env={**env, "GSWARM_REDIS_URL": "redis://h:6379/0"}
    )
    assert r.exit_code == 2 and "the broker is GSWARM_REDIS_URL (h:6379)" in r.output, r.output
    r = runner.invoke(main, ["host", "start", "--port", "0"], env=env)
    assert r.exit_code == 2 and "--port" in r.output


def test_client_connect_addresses_and_credentials(tmp_path: Path) -> None:
    s = settings_here(tmp_path)
    assert broker_of("master:8090", None, s) == ("redis://master:8090/0", None)
    assert broker_of("master", "p@ss", s) == ("redis://:p%40ss@master:8090/0", "--token")
    assert broker_of("[fd00::1]:7000", "t", s) == ("redis://:t@[fd00::1]:7000/0", "--token")
    assert broker_of(None, None, settings_here(tmp_path, GSWARM_API_HOST="head", GSWARM_JOIN_TOKEN="j")) == (
        "redis://:j@head:8090/0",
        "GSWARM_JOIN_TOKEN / cluster.join_token",
    )
    # a Redis URL as it was (with --token added when it has no password)
    assert broker_of("redis://h:6379/2", None, s) == ("redis://h:6379/2", None)
    assert broker_of("redis://h:6379/2", "t", s) == ("redis://:t@h:6379/2", "--token")
    joining = settings_here(tmp_path, GSWARM_JOIN_TOKEN="j t")  # every documented source works with a URL too
    assert broker_of("redis://h:6379/2", None, joining) == (
        "redis://:j%20t@h:6379/2",
        "GSWARM_JOIN_TOKEN / cluster.join_token",
    )
    assert broker_of("redis://:own@h:6379/2", None, joining) == ("redis://:own@h:6379/2", "the URL")
    # on the host itself, its own broker's password
    Path(s.home).mkdir(parents=True)
    (Path(s.home) / "redis.password").write_text("mine\n")
    own = str(Path(s.home) / "redis.password")
    assert broker_of("127.0.0.1:8090", None, s) == ("redis://:mine@127.0.0.1:8090/0", own)
    r = CliRunner().invoke(
        main, ["client", "connect", "a:b:c"], env={"GSWARM_HOME": s.home, "GSWARM_CONFIG": ""}
    )
    assert r.exit_code == 2 and "is not HOST:PORT" in r.output


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["start", "--port", "8090", "--http-port", "8080"], "`gswarm host start --port 8090 --http-port 8080`"),
        (["start", "--background", "--port", "8090"], "under your service manager"),
        (["start", "--data-dir", "/d"], "`GSWARM_HOME=/d gswarm host start`"),
        (["connect", "192.168.1.100:8090", "--node-id", "gpu-worker-01"],
         "`gswarm client connect 192.168.1.100:8090 --node gpu-worker-01`"),
        (["generate-grpc"], "no gRPC files to generate"),
    ],
)  # fmt: skip
def test_gsmodel_commands_of_the_grpc_era_say_what_to_type(argv: list[str], says: str) -> None:
    r = CliRunner().invoke(gsmodel, argv)
    assert r.exit_code == 2 and says in r.output, r.output


def test_gsmodel_runs_gswarms_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "examples"
    r = runner.invoke(gsmodel, ["example", "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert (
        out / "simple-deployment.yaml"
    ).is_file()  # what `gsmodel job examples/simple-deployment.yaml` runs
    mapped = {"list": "gswarm model list", "job": "gswarm workflow run", "unregister": "gswarm model delete",
              "job-status": "gswarm workflow status", "nodes": "gswarm nodes"}  # fmt: skip
    for verb, help_of in mapped.items():
        r = runner.invoke(gsmodel, [verb, "--help"])
        assert r.exit_code == 0 and help_of in r.output, (verb, r.output)
    assert "--verbose" in runner.invoke(gsmodel, ["job-status", "--help"]).output
    assert "--desc" in runner.invoke(gsmodel, ["register", "--help"]).output


def test_original_status_words_and_flags_exist() -> None:
    runner = CliRunner()
    for argv, flag in (
        (["queue", "tasks", "--help"], "completed"),
        (["model", "list", "--help"], "--verbose"),
        (["nodes", "--help"], "--verbose"),
        (["model", "register", "--help"], "--desc"),
        (["model", "service-health", "--help"], "NAME_OR_SERVICE"),
        (["node", "status", "--help"], "NAME"),
        (["client", "connect", "--help"], "--resilient"),
    ):
        r = runner.invoke(main, argv)
        assert r.exit_code == 0 and flag in r.output, (argv, r.output)
    r = runner.invoke(main, ["queue", "tasks", "--status", "done"])
    assert r.exit_code == 2 and "completed" in r.output


def test_the_cli_finds_the_api_of_the_gswarm_running_under_its_home(tmp_path: Path) -> None:
    from gswarm_web.cli.client import ApiClient
    from gswarm_web.cli.local import update_run
    from gswarm_web.cli.original.gsprof import main as gsprof

    s = settings_here(tmp_path)
    home = Path(s.home)
    home.mkdir(parents=True)
    env = {"GSWARM_HOME": str(home), "GSWARM_CONFIG": ""}
    assert ApiClient.from_settings(s).base_url == "http://127.0.0.1:8091"  # nothing runs: the defaults
    api_port, broker = free_port(), free_port()  # nothing listens there: the CLI's calls fail naming the URL
    claim_run(home, "host start")  # as `host start --http-port P --port B --host 0.0.0.0` records itself
    update_run(home, api=f"http://0.0.0.0:{api_port}", broker=f"redis://:***@0.0.0.0:{broker}/0")
    try:
        assert ApiClient.from_settings(s).base_url == f"http://127.0.0.1:{api_port}"
        named = settings_here(tmp_path, GSWARM_API_URL="http://elsewhere:1")
        assert ApiClient.from_settings(named).base_url == "http://elsewhere:1"  # an explicit URL wins
        r = CliRunner().invoke(main, ["nodes"], env=env)
        assert r.exit_code == 1 and f"http://127.0.0.1:{api_port}" in r.output, r.output
        # gsprof's HOST:PORT: the broker port (the original's gRPC port) names the API beside it; any other the API
        other = free_port()
        for address, api in (
            (f"127.0.0.1:{broker}", f"http://127.0.0.1:{api_port}"),
            (f"127.0.0.1:{other}", f"http://127.0.0.1:{other}"),
            ("127.0.0.1", "http://127.0.0.1:8091"),
            ("127.0.0.1:8090", "http://127.0.0.1:8091"),
        ):
            r = CliRunner().invoke(gsprof, ["status", address], env=env)
            assert r.exit_code == 1 and f"cannot reach the gswarm API at {api}" in r.output, (
                address,
                r.output,
            )
        r = CliRunner().invoke(gsprof, ["status", "host:port"], env=env)
        assert r.exit_code == 2 and "is not HOST[:PORT]" in r.output
    finally:
        release_run(home)
        os.environ.pop("GSWARM_API_URL", None)  # gsprof points this process's CLI at the head it was given
