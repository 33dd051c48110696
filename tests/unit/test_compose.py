"""docker-compose.yml describes the cluster DESIGN.md draws, and docker-compose accepts it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def services() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_compose_has_every_process_with_its_command() -> None:
    s = services()
    assert {"postgres", "redis", "web", "control", "beat", "node1", "node2", "flower"} <= set(s)
    cmd = {name: " ".join(svc.get("command") or []) for name, svc in s.items()}
    assert "gunicorn" in cmd["web"] and "gswarm_web:create_app()" in cmd["web"]
    assert "-A gswarm_web.celery_app worker -Q control" in cmd["control"]
    assert "-A gswarm_tasks beat" in cmd["beat"]
    assert "-A gswarm_tasks worker -Q node1 -n node1@%h" in cmd["node1"]
    assert "-A gswarm_tasks worker -Q node2 -n node2@%h" in cmd["node2"]
    assert "flower" in cmd["flower"]
    assert (ROOT / "Dockerfile").is_file()


def test_compose_file_validates() -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        # `make test` installs docker-compose where it can; without it the structural test above still runs.
        assert services()
        return
    proc = subprocess.run(
        [tool, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "GSWARM_ADMIN_TOKEN": "x"},
    )
    assert proc.returncode == 0, proc.stderr
