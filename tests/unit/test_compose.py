"""docker-compose.yml describes the cluster DESIGN.md draws, docker-compose accepts it, and it is secure by default:
no start without its three secrets, nodes that hold only the broker URL, Flower behind basic auth, Redis behind a
password, and the API published only through nginx, running gswarm up's own web command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gswarm_web.cli.up import web_argv

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "GSWARM_ADMIN_TOKEN": "t" * 48,
    "FLOWER_BASIC_AUTH": "ops:flower-secret",
    "GSWARM_REDIS_PASSWORD": "0123456789abcdef0123456789abcdef",
}
BROKER_ONLY = ("beat", "node1", "node2", "flower")


def services() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("docker-compose")
    assert tool is not None, (
        "docker-compose is not installed (scripts/services.sh installs it: make services)"
    )
    return subprocess.run(
        [tool, "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=60,
    )


def resolved() -> dict[str, Any]:
    proc = compose_config(SECRETS)
    assert proc.returncode == 0, proc.stderr
    return dict(yaml.safe_load(proc.stdout)["services"])


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    return dict(env) if isinstance(env, dict) else dict(e.split("=", 1) for e in env)


def port_spec(port: str | dict[str, Any]) -> str:
    """host_ip:published:target of a port in either of docker-compose's spellings."""
    if isinstance(port, str):
        return port.removesuffix("/tcp")
    return f"{port.get('host_ip', '')}:{port['published']}:{port['target']}"


def test_compose_has_every_process_with_its_command() -> None:
    s = services()
    assert {"postgres", "redis", "web", "proxy", "control", "beat", "node1", "node2", "flower"} <= set(s)
    cmd = {name: " ".join(svc.get("command") or []) for name, svc in s.items()}
    assert "gunicorn" in cmd["web"] and "gswarm_web:create_app()" in cmd["web"]
    assert "-A gswarm_web.celery_app worker -Q control" in cmd["control"]
    assert "-A gswarm_tasks beat" in cmd["beat"]
    assert "-A gswarm_tasks worker -Q node1 -n node1@%h" in cmd["node1"]
    assert "-A gswarm_tasks worker -Q node2 -n node2@%h" in cmd["node2"]
    assert "flower" in cmd["flower"]
    assert "nginx" in cmd["proxy"] and "/app/config/nginx.conf" in cmd["proxy"]
    assert (ROOT / "Dockerfile").is_file()


def test_compose_file_validates_with_its_secrets() -> None:
    assert set(resolved()) >= {"web", "proxy", "node1", "flower"}


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(missing: str) -> None:
    proc = compose_config({k: v for k, v in SECRETS.items() if k != missing})
    assert proc.returncode != 0
    assert missing in proc.stderr, proc.stderr
    empty = compose_config({**SECRETS, missing: ""})  # `:?` refuses an empty value too
    assert empty.returncode != 0 and missing in empty.stderr


def test_nodes_beat_and_flower_get_the_broker_url_only() -> None:
    s = resolved()
    for name in BROKER_ONLY:
        env = env_of(s[name])
        assert "GSWARM_DATABASE_URL" not in env and "GSWARM_ADMIN_TOKEN" not in env, (name, env)
        assert not any(SECRETS["GSWARM_ADMIN_TOKEN"] in v or "postgres" in v for v in env.values()), (
            name,
            env,
        )
        assert "database" not in s[name]["networks"], name  # no route to Postgres either
    # What the node code reads: nothing from the database or the admin token (gswarm_tasks never needs them).
    for path in (ROOT / "gswarm_tasks").rglob("*.py"):
        text = path.read_text()
        if path.name != "settings.py":
            assert "database_url" not in text and "admin_token" not in text, path


def test_every_gswarm_process_uses_the_redis_password() -> None:
    s = resolved()
    password = SECRETS["GSWARM_REDIS_PASSWORD"]
    assert s["redis"]["command"][-2:] == ["--requirepass", password]
    for name, svc in s.items():
        if svc.get("image") == "gswarm:latest" and name not in ("migrate", "proxy"):
            assert env_of(svc)["GSWARM_REDIS_URL"] == f"redis://:{password}@redis:6379/0", name
    assert env_of(s["web"])["GSWARM_ADMIN_TOKEN"] == SECRETS["GSWARM_ADMIN_TOKEN"]
    assert set(env_of(s["migrate"])) == {"GSWARM_DATABASE_URL", "GSWARM_HOME"}


def test_flower_needs_basic_auth_from_the_environment() -> None:
    s = resolved()
    assert env_of(s["flower"])["FLOWER_BASIC_AUTH"] == SECRETS["FLOWER_BASIC_AUTH"]
    raw = (ROOT / "docker-compose.yml").read_text()
    assert re.search(r"FLOWER_BASIC_AUTH: \$\{FLOWER_BASIC_AUTH:\?", raw)  # no default
    # Flower itself turns FLOWER_<OPTION> into its --<option> (here --basic_auth), in a fresh interpreter.
    code = "from flower.command import apply_env_options; from tornado.options import options; import flower.options;"
    code += "apply_env_options(); print(options.basic_auth)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "FLOWER_BASIC_AUTH": "ops:pw"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "['ops:pw']", out.stderr


def test_the_api_is_published_only_through_the_proxy_with_gswarm_ups_command() -> None:
    s = resolved()
    assert "ports" not in s["web"]
    published = {
        name: [port_spec(p) for p in svc.get("ports") or []] for name, svc in s.items() if svc.get("ports")
    }
    assert published == {"proxy": ["127.0.0.1:8091:8080"], "flower": ["127.0.0.1:5555:5555"]}
    conf = (ROOT / "config" / "nginx.conf").read_text()
    assert "listen 8080;" in conf and "server web:8091;" in conf
    for directive in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        assert re.search(rf"^\s*{directive} \d+s;", conf, re.M), directive
    # One web command line: gswarm up's, the compose web service's and the image's default.
    up = web_argv("0.0.0.0", 8091)[3:]  # past `python -m gunicorn`
    assert services()["web"]["command"] == ["gunicorn", *up]
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = yaml.safe_load(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    assert cmd == ["gunicorn", *up]
    assert re.search(r"apt-get install .*nginx-light", dockerfile)
