"""Threads of the built-in model server: from settings or the service's config, checked at the API."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from gswarm_tasks.serving.engines import BUILTIN
from gswarm_tasks.serving.launch import server_argv
from gswarm_tasks.serving.model_server import parse_args
from gswarm_web.extensions import db
from gswarm_web.tables import Model
from tests.harness.app import bearer


def argv(config: dict[str, object], cpu_threads: int = 1) -> list[str]:
    out = server_argv(BUILTIN, Path("/m"), "m", "127.0.0.1", 8080, "cpu", config, False, cpu_threads)
    return out[: out.index("--device")]  # the threads flag is the last of the parameters


def test_threads_come_from_the_setting_unless_the_config_says() -> None:
    default = argv({})
    assert default[default.index("--threads") + 1] == "1"
    assert argv({}, cpu_threads=0)[-1] == "0"
    assert argv({"threads": 4})[-1] == "4"
    assert (
        parse_args(["--model-path", "/m", "--model-name", "m", "--port", "0"]).threads == 0
    )  # torch's default
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "/m", "--model-name", "m", "--port", "0", "--threads", "-1"])


@pytest.mark.parametrize(
    "config", [{"threads": -1}, {"threads": "4"}, {"threads": True}, {"max_batch_size": 0}]
)
def test_bad_server_config_is_422_naming_the_key_and_creates_nothing(
    app: Flask, client: FlaskClient, admin_token: str, config: dict[str, object]
) -> None:
    h = bearer(admin_token)
    with app.app_context():
        db.session.add(Model(name="tiny", model_type="embedding"))
        db.session.commit()
    r = client.post(
        "/api/v1/services", json={"model_name": "tiny", "device": "n1:cpu", "config": config}, headers=h
    )
    assert r.status_code == 422, r.get_json()
    assert r.get_json()["error"]["details"]["field"] == f"config.{next(iter(config))}"
    assert client.get("/api/v1/services", headers=h).get_json()["services"] == []
