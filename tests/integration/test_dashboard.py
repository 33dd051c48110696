"""The dashboard in a real browser (Debian's Chromium through Playwright) against a real fleet: the control worker,
two node workers with two fake GPUs each, the API over HTTP. Every request a page makes is checked to go to the
API's host (anything else is blocked and fails the test); the API docs render with no network."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import requests

from gswarm_tasks import names
from gswarm_web.cli.up import control_plane_specs, free_port
from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import Proc, wait_for

pytestmark = pytest.mark.serial  # see pyproject.toml: runs alone after the parallel part

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard"
# The screenshots the docs use (docs/guides/dashboard.md): the artifact each test writes -> its name under DOCS.
DOCS_SCREENSHOTS = {
    "fleet.png": "fleet.png",
    "workflow.png": "workflow.png",
    "workflow-failed.png": "workflow-failed.png",
    "models-actions.png": "models.png",
    "profiler-session.png": "profiler.png",
    "page-queue.png": "queue.png",
    "page-scheduling.png": "scheduling.png",
}
PAGES = ("fleet", "models", "workflows", "queue", "profiler", "scheduling", "data")

OK_WORKFLOW = """name: dash-ok
description: three noop steps, the last after the other two
actions:
  - action_id: fetch
    action_type: noop
    duration_s: 1.5
  - action_id: prepare
    action_type: noop
  - action_id: report
    action_type: noop
    dependencies: [fetch, prepare]
"""

FAILING_WORKFLOW = """name: dash-fails
actions:
  - action_id: first
    action_type: noop
  - action_id: flaky
    action_type: noop
    fail_times: 3
    dependencies: [first]
  - action_id: last
    action_type: noop
    dependencies: [flaky]
"""

INVALID_WORKFLOW = """name: dash-invalid
actions:
  - action_id: good
    action_type: noop
  - action_id: bad
    action_type: teleport
    dependencies: [good]
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("dashboard")
    tiny = tmp / "models" / "tiny"  # a small model for the download and copy the page plans and runs
    tiny.mkdir(parents=True)
    (tiny / "config.json").write_text('{"model_type": "tiny"}')
    (tiny / "weights.bin").write_bytes(os.urandom(4 << 20))
    env = {"GSWARM_FAKE_GPUS": "2", "GSWARM_MODELS_ALLOWED_ROOTS": str(tiny.parent)}
    with running_fleet(tmp, extra_env=env) as f:
        f.tiny_model = tiny  # type: ignore[attr-defined]
        # the API as `gswarm up` serves it (its own gunicorn command line), in a process of its own
        port = free_port()
        web = next(s for s in control_plane_specs(f.settings, f.env, "127.0.0.1", port) if s.name == "web")
        argv = list(web.argv)
        f.procs["web"] = Proc("web", argv, f.env, tmp / "logs").start()
        f.base_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        wait_for(lambda: requests.get(f"{f.base_url}/api/v1/health", timeout=2).ok, 30, "the API on gunicorn")
        from gswarm_web.api.auth import create_token

        f.read_token = create_token("viewer", "read-only")  # type: ignore[attr-defined]
        wait_for(lambda: len(f.get("/metrics/latest")[1]["nodes"]) == 2, 30, "frames from both nodes")
        yield f


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Screenshots and figures; GSWARM_TEST_ARTIFACTS names a folder to keep them in (default: pytest's tmp)."""
    where = os.environ.get("GSWARM_TEST_ARTIFACTS")
    path = Path(where) / "dashboard" if where else tmp_path_factory.mktemp("dashboard-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() and shutil.which("chromium")):
        pytest.fail(
            f"{CHROMIUM} is missing: the dashboard is tested in Debian's Chromium. Install it with "
            "`apt-get install -y chromium` (`make dev` does)."
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


class Watched:
    """A browser context whose every request is recorded; one to any host but the API's is blocked and noted."""

    def __init__(self, browser: Any, base_url: str) -> None:
        self.host = urlsplit(base_url).netloc
        self.requests: list[str] = []
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.requests.append(url)
        if url.startswith("data:") or url.startswith("blob:") or urlsplit(url).netloc == self.host:
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def close(self) -> None:
        self.context.close()
        assert not self.blocked, f"requests to other hosts than the API's: {self.blocked}"
        assert not self.errors, f"errors in the page: {self.errors}"
        assert self.requests, "no request was seen"


def _sign_in(page: Any, base_url: str, token: str) -> None:
    page.goto(base_url + "/")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#me")


@pytest.fixture
def admin(browser: Any, fleet: Fleet) -> Iterator[Any]:
    w = Watched(browser, fleet.base_url)  # type: ignore[attr-defined]
    _sign_in(w.page, fleet.base_url, fleet.token)  # type: ignore[attr-defined]
    yield w.page
    w.close()


@pytest.fixture
def viewer(browser: Any, fleet: Fleet) -> Iterator[Any]:
    w = Watched(browser, fleet.base_url)  # type: ignore[attr-defined]
    _sign_in(w.page, fleet.base_url, fleet.read_token)  # type: ignore[attr-defined]
    yield w.page
    w.close()


def _shown_percent(value: float) -> str:
    """The page's rounding (JavaScript's toFixed: halves away from zero)."""
    return f"{Decimal(str(value)).quantize(Decimal(1), rounding=ROUND_HALF_UP)}%"


def _frames_by_seq(fleet: Fleet, node: str) -> dict[int, dict[str, Any]]:
    client = redis.Redis.from_url(fleet.redis_url)
    out = {}
    for _id, fields in client.xrevrange(names.frames_stream(node), count=200):
        frame = json.loads(fields[b"data"])
        out[int(frame["seq"])] = frame
    return out


def test_a_bad_token_is_refused_and_a_good_one_kept_for_the_session(browser: Any, fleet: Fleet) -> None:
    w = Watched(browser, fleet.base_url)  # type: ignore[attr-defined]
    page = w.page
    _sign_in_attempt = page.goto(fleet.base_url + "/")  # type: ignore[attr-defined]
    assert _sign_in_attempt is not None and _sign_in_attempt.ok
    page.fill("#token", "gsw_not-a-token")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login .errorbox")
    assert "not valid" in page.inner_text("#login")
    page.fill("#token", fleet.token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#me")
    assert page.evaluate("sessionStorage.getItem('gswarm.token')") == fleet.token
    assert page.evaluate("localStorage.length") == 0
    page.reload()  # the same browser session: still signed in
    page.wait_for_selector("#me")
    assert page.get_attribute("#me", "data-role") == "admin"
    page.click("#signout")
    page.wait_for_selector("#login")
    assert page.evaluate("sessionStorage.getItem('gswarm.token')") is None
    # 401s from the page were expected here: only the host check applies
    w.errors.clear()
    w.close()


def test_fleet_shows_both_nodes_and_gpu_utilisation_follows_the_frames(
    admin: Any, fleet: Fleet, artifacts: Path
) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/fleet")  # type: ignore[attr-defined]
    for node in ("node1", "node2"):
        page.wait_for_selector(f'[data-node="{node}"][data-status="healthy"]')
        for i in (0, 1):
            page.wait_for_selector(f'[data-gpu="{node}:gpu{i}"][data-seq]:not([data-seq=""])')
    assert page.locator(".gpu").count() == 4

    # Each value the page shows is the one in the frame it names (by seq), and it moves on as new frames come.
    matched: dict[int, float] = {}
    deadline = time.monotonic() + 30
    tile = page.locator('[data-gpu="node1:gpu0"]')
    while len(matched) < 4 and time.monotonic() < deadline:
        seq, util, text = tile.evaluate(
            "t => [t.dataset.seq, t.dataset.util, t.querySelector('.util').textContent]"
        )
        frame = _frames_by_seq(fleet, "node1").get(int(seq))
        assert frame is not None, f"the page shows frame {seq}, which is not in the stream"
        expected = frame["gpus"][0]["utilization_percent"]
        assert float(util) == expected and text == _shown_percent(expected), (seq, util, text, expected)
        matched[int(seq)] = expected
        page.wait_for_function(
            "seq => document.querySelector('[data-gpu=\"node1:gpu0\"]').dataset.seq !== seq",
            arg=seq,
            timeout=10_000,
        )
    assert len(matched) >= 4, f"the tile followed only {len(matched)} frames in 30 s: {matched}"
    assert len(set(matched.values())) > 1, f"utilisation never changed: {matched}"
    page.wait_for_function("() => document.querySelector('#page-fleet').dataset.updates > 2")
    page.wait_for_function(
        "() => document.querySelector('[data-gpu=\"node1:gpu0\"] polyline').getAttribute('points').split(' ').length"
        " >= 20"
    )  # a sparkline of the last frames
    page.screenshot(path=str(artifacts / "fleet.png"), full_page=True)


def test_a_workflow_submitted_from_the_page_runs_to_succeeded_on_its_dag(
    admin: Any, fleet: Fleet, artifacts: Path
) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/workflows")  # type: ignore[attr-defined]
    page.fill("#workflow-yaml", OK_WORKFLOW)
    page.click("#submit-workflow")
    page.wait_for_url("**/#/workflows/*")
    wf_id = page.url.rsplit("/", 1)[1]
    # live: the long step is seen running on the graph before everything has succeeded
    page.wait_for_selector('svg.dag g.step[data-step="fetch"][data-status="running"]')
    page.wait_for_selector('#page-workflows[data-status="succeeded"]', timeout=60_000)
    steps = page.locator("svg.dag g.step")
    assert steps.count() == 3
    assert {steps.nth(i).get_attribute("data-status") for i in range(3)} == {"succeeded"}
    assert page.locator("svg.dag path.edge").count() == 2
    assert page.locator('svg.dag g.step[data-step="report"] rect').get_attribute("class") == "f-succeeded"
    code, body = fleet.get(f"/workflows/{wf_id}")
    assert code == 200 and body["status"] == "succeeded"
    for step in body["steps"]:
        row = page.locator(f'#steps tr[data-step="{step["action_id"]}"]')
        assert row.get_attribute("data-status") == "succeeded"
        assert (step["node"] or "—") in row.inner_text()
    page.screenshot(path=str(artifacts / "workflow.png"), full_page=True)
    page.goto(fleet.base_url + "/#/workflows")  # type: ignore[attr-defined]
    page.wait_for_selector(f'#workflow-list tr[data-workflow="{wf_id}"][data-status="succeeded"]')


def test_a_failing_workflow_shows_its_error_on_the_step_that_failed(
    admin: Any, fleet: Fleet, artifacts: Path
) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/workflows")  # type: ignore[attr-defined]
    page.fill("#workflow-yaml", FAILING_WORKFLOW)
    page.click("#submit-workflow")
    page.wait_for_url("**/#/workflows/*")
    wf_id = page.url.rsplit("/", 1)[1]
    page.wait_for_selector('#page-workflows[data-status="failed"]', timeout=60_000)
    code, body = fleet.get(f"/workflows/{wf_id}")
    assert code == 200 and body["status"] == "failed"
    api_steps = {s["action_id"]: s for s in body["steps"]}
    message = api_steps["flaky"]["error"]["message"]
    assert "fail" in message
    statuses = {s: page.get_attribute(f'#steps tr[data-step="{s}"]', "data-status") for s in api_steps}
    assert statuses == {s: api_steps[s]["status"] for s in api_steps}
    assert statuses["first"] == "succeeded" and statuses["flaky"] == "failed"
    assert page.inner_text('#steps tr[data-step="flaky"] .step-error') == message
    assert page.locator("#steps .step-error").count() == sum(1 for s in api_steps.values() if s["error"])
    assert page.locator('svg.dag g.step[data-step="flaky"] rect').get_attribute("class") == "f-failed"
    assert message in (page.text_content('svg.dag g.step[data-step="flaky"] title') or "")
    page.screenshot(path=str(artifacts / "workflow-failed.png"), full_page=True)


def test_cancel_from_the_page_stops_a_running_workflow(admin: Any, fleet: Fleet) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/workflows")  # type: ignore[attr-defined]
    page.fill(
        "#workflow-yaml",
        "name: dash-long\nactions:\n  - action_id: wait\n    action_type: noop\n    duration_s: 60\n",
    )
    page.click("#submit-workflow")
    page.wait_for_url("**/#/workflows/*")
    page.wait_for_selector('svg.dag g.step[data-step="wait"][data-status="running"]')
    page.click("#cancel")
    page.wait_for_selector('#page-workflows[data-status="cancelled"]', timeout=30_000)
    page.wait_for_selector('svg.dag g.step[data-step="wait"][data-status="cancelled"]', timeout=30_000)
    assert page.locator("#cancel").count() == 0


def test_a_profiling_session_started_stopped_plotted_and_exported_from_the_page(
    admin: Any, fleet: Fleet, artifacts: Path
) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/profiler")  # type: ignore[attr-defined]
    page.fill("#session-name", "dash-session")
    page.fill("#session-freq", "200")
    page.click("#session-start")
    page.wait_for_selector('tr[data-session="dash-session"][data-status="active"]')
    # the live timeline draws every GPU of both nodes from the frames
    for key in ("node1:gpu0", "node1:gpu1", "node2:gpu0", "node2:gpu1"):
        page.wait_for_selector(f'#gpu-timeline g[data-gpu="{key}"] polyline[points*=","]')
    wait_for(
        lambda: (fleet.get("/profiler/sessions/dash-session")[1].get("frame_count") or 0) > 3, 30, "frames"
    )
    page.click('tr[data-session="dash-session"] button:has-text("Stop")')
    page.wait_for_selector('tr[data-session="dash-session"][data-status="stopped"]')
    page.click('tr[data-session="dash-session"] button:has-text("Plot")')
    img = page.wait_for_selector("#profiler-plot img")
    page.wait_for_function("() => document.querySelector('#profiler-plot img').naturalWidth > 100")
    assert (img.get_attribute("src") or "").startswith("blob:")
    with page.expect_download() as dl:
        page.click('tr[data-session="dash-session"] button:has-text("Export")')
    exported = json.loads(Path(dl.value.path()).read_text())
    assert exported["frames"], list(exported)
    page.screenshot(path=str(artifacts / "profiler-session.png"), full_page=True)


def test_model_actions_show_the_placement_decision_before_they_run(
    admin: Any, fleet: Fleet, artifacts: Path
) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/models")  # type: ignore[attr-defined]
    page.fill("#reg-name", "dash-tiny")
    page.fill("#reg-type", "embedding")
    page.fill("#reg-source", f"file://{fleet.tiny_model}")  # type: ignore[attr-defined]
    page.click('#page-models button:has-text("Register")')
    page.wait_for_selector('#models-registry tr[data-model="dash-tiny"]')
    page.wait_for_selector('#act-model option[value="dash-tiny"]', state="attached")

    def plan_and_run(action: str, target: str) -> str:
        page.select_option("#act-model", "dash-tiny")
        page.select_option("#act-action", action)
        page.fill("#act-target", target)
        page.dispatch_event("#act-target", "change")
        assert page.is_disabled("#act-run"), "Run is offered before the decision is shown"
        page.click("#act-plan")
        chosen = page.locator("#decision p b").inner_text()
        kind = f"&kind={target.split(':')[1]}" if target.startswith("auto:") else ""
        code, decision = fleet.get(f"/placement?model=dash-tiny&action={action}{kind}")
        assert code == 200 and chosen == decision["chosen"], (chosen, decision)
        if not target.startswith("auto"):  # a named device: auto's choice is shown for comparison
            assert page.locator("#decision p").inner_text().startswith(f"You named {target}")
            chosen = target
        assert page.locator("#decision tr.chosen").count() == 1
        page.click("#act-run")
        page.wait_for_selector("#model-actions .okbox, #model-actions .errorbox")
        assert page.locator("#model-actions .errorbox").count() == 0, page.inner_text("#model-actions")
        accepted = page.locator("#model-actions .okbox").inner_text()
        task_id = accepted.split("task ")[1].split()[0]
        page.wait_for_selector(
            f'#operations tr[data-task="{task_id[:8]}"], #operations tr[data-task="{task_id}"]'
        )
        fleet.wait_task(task_id, 60)
        page.wait_for_selector(f'#models-matrix tr[data-model="dash-tiny"] td[data-device="{chosen}"] .dot')
        return chosen

    first = plan_and_run("download", "auto:disk")
    second = plan_and_run("copy", "node2:disk")
    assert first != second and {first, second} == {"node1:disk", "node2:disk"}
    code, model = fleet.get("/models/dash-tiny")
    assert sorted(model["locations"]) == ["node1:disk", "node2:disk"]
    page.wait_for_selector('#operations tr[data-task] .badge[data-status="succeeded"]')
    page.screenshot(path=str(artifacts / "models-actions.png"), full_page=True)


def test_validation_errors_sit_beside_the_action_and_field_and_examples_are_one_click_away(
    admin: Any, fleet: Fleet
) -> None:
    page = admin
    page.goto(fleet.base_url + "/#/workflows")  # type: ignore[attr-defined]
    page.fill("#workflow-yaml", INVALID_WORKFLOW)
    page.click("#validate")
    note = page.locator('.field-error[data-action="bad"][data-field="action_type"]')
    note.wait_for()
    assert "teleport" in note.inner_text()
    line = note.evaluate("n => n.previousElementSibling.textContent")
    assert line.endswith("action_type: teleport"), line
    assert page.locator(".field-error").count() == 1
    # the examples, from the API: the original one verbatim in the editor, and it validates
    examples = fleet.get("/workflows/examples")[1]["examples"]
    page.select_option("#example", "original:simple-deployment")
    assert page.input_value("#workflow-yaml") == examples[0]["original"]
    assert page.locator(".field-error").count() == 0
    page.click("#validate")
    page.wait_for_selector("#submit-result .okbox")


def test_a_read_only_token_sees_no_write_buttons_and_its_writes_are_refused(
    viewer: Any, fleet: Fleet, artifacts: Path
) -> None:
    page = viewer
    assert page.get_attribute("#me", "data-role") == "read-only"
    page.wait_for_selector("#read-only")
    for name in PAGES:
        page.goto(f"{fleet.base_url}/#/{name}")  # type: ignore[attr-defined]
        page.wait_for_selector(f"#page-{name} h1")
        page.wait_for_load_state("networkidle")
        assert page.locator("[data-write]").count() == 0, name
        assert page.locator(f"#page-{name} button:not([data-read])").count() == 0, name
    assert page.locator("#submit").count() == 0
    # a workflow's page: no cancel
    code, listed = fleet.get("/workflows")
    page.goto(f"{fleet.base_url}/#/workflows/{listed['workflows'][0]['id']}")  # type: ignore[attr-defined]
    page.wait_for_selector("svg.dag")
    assert page.locator("[data-write], #cancel").count() == 0
    # the page's own API calls, used to write: refused by the API
    refused = page.evaluate(
        """async () => {
            const m = await import('/dashboard/static/js/api.js');
            const out = [];
            const writes = [['/workflows', {name: 'x', actions: []}], ['/profiler/sessions', {name: 'x'}]];
            for (const [path, body] of writes) {
                try { await m.post(path, body); out.push('accepted'); } catch (e) { out.push([e.status, e.code]); }
            }
            return out;
        }"""
    )
    assert refused == [[403, "FORBIDDEN"], [403, "FORBIDDEN"]], refused
    page.goto(f"{fleet.base_url}/#/fleet")  # type: ignore[attr-defined]
    page.wait_for_selector('[data-gpu="node2:gpu1"]')
    page.screenshot(path=str(artifacts / "read-only-fleet.png"), full_page=True)


def test_every_page_renders_from_the_api(admin: Any, fleet: Fleet, artifacts: Path) -> None:
    page = admin
    expect = {
        "fleet": '[data-gpu="node1:gpu0"]',
        "models": "#models-registry",
        "workflows": "#workflow-list table",
        "queue": "#queue-counts table",
        "profiler": "#profiler-sessions table",
        "scheduling": "#scheduling-fleet table",
        "data": "#chunks table",
    }
    for name, selector in expect.items():
        page.goto(f"{fleet.base_url}/#/{name}")  # type: ignore[attr-defined]
        page.wait_for_selector(selector)
        page.wait_for_load_state("networkidle")
        assert page.locator(f"#page-{name} .errorbox").count() == 0, page.inner_text(f"#page-{name}")
        page.screenshot(path=str(artifacts / f"page-{name}.png"), full_page=True)


def test_the_api_docs_render_with_no_network(browser: Any, fleet: Fleet, artifacts: Path) -> None:
    w = Watched(browser, fleet.base_url)  # type: ignore[attr-defined]
    page = w.page
    page.goto(fleet.base_url + "/api/v1/docs")  # type: ignore[attr-defined]
    page.wait_for_selector(".swagger-ui .info .title")
    assert "gswarm" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_function("() => document.querySelectorAll('.opblock').length > 20")
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(artifacts / "api-docs.png"))
    assert all(urlsplit(u).netloc == w.host for u in w.requests if u.startswith("http"))
    w.close()  # asserts nothing was blocked


def test_the_page_weighs_under_500_kb(browser: Any, fleet: Fleet, artifacts: Path) -> None:
    """Every byte the dashboard's first load fetches (HTML, CSS, modules), before caching."""
    w = Watched(browser, fleet.base_url)  # type: ignore[attr-defined]
    sizes: dict[str, int] = {}
    w.page.on(
        "response", lambda r: sizes.__setitem__(r.url, len(r.body())) if "/api/v1/" not in r.url else None
    )
    w.page.goto(fleet.base_url + "/")  # type: ignore[attr-defined]
    w.page.wait_for_selector("#login")
    w.page.wait_for_load_state("networkidle")
    total = sum(sizes.values())
    (artifacts / "page-weight.json").write_text(json.dumps({"total_bytes": total, "files": sizes}, indent=1))
    assert any(u.endswith("/js/pages/fleet.js") for u in sizes), sizes
    assert total < 500 * 1024, f"{total} bytes: {sizes}"
    w.close()


def test_fleet_of_200_nodes_with_8_gpus_paints_fast_and_keeps_up(
    admin: Any, fleet: Fleet, artifacts: Path
) -> None:
    """200 synthetic nodes x 8 GPUs: rows in the node table, newest frames written each 0.5 s as the frames consumer
    writes them; the page's own measures (first paint from navigation, the first draw, each update) are read back
    and written to fleet-200x8.json. On a quiet host the first paint is 0.5 to 0.9 s; this suite shares small hosts
    with others, where a load mostly waits for the CPU, so the bounds below catch a page that got slower, not a
    busy machine: the best of three loads under 1.5 s, building the 1600 tiles under 1 s, updates under 0.5 s and
    at the pace of the frames."""
    from gswarm_web.extensions import db
    from gswarm_web.tables import Node, NodeGpu

    n_nodes, n_gpus = 200, 8
    names_ = [f"synth{i:03d}" for i in range(n_nodes)]
    now = datetime.now(UTC)
    for name in names_:
        db.session.add(
            Node(
                name=name,
                hostname=name,
                cpu_count=64,
                cpu_percent=10.0,
                dram_total_bytes=512 << 30,
                dram_available_bytes=400 << 30,
                storage={"disk": {"total_bytes": 4 << 40, "used_bytes": 1 << 40}},
                first_seen=now,
                last_seen=now,
                gpus=[NodeGpu(index=i, name="H100", memory_total_bytes=80 << 30) for i in range(n_gpus)],
            )
        )
    db.session.commit()
    client = redis.Redis.from_url(fleet.redis_url)
    engine = db.engine  # the writer thread has no app context
    stop = threading.Event()

    def frames() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            t = time.time()
            mapping = {}
            for k, name in enumerate(names_):
                gpus = [
                    {
                        "index": i,
                        "name": "H100",
                        "utilization_percent": (seq * 7 + k + i * 13) % 101,
                        "memory_used_bytes": ((seq + i) % 80) << 30,
                        "memory_total_bytes": 80 << 30,
                        "temperature_c": 50,
                        "power_w": 400.0,
                        "processes": [],
                    }
                    for i in range(n_gpus)
                ]
                mapping[name] = json.dumps(
                    {
                        "node": name,
                        "seq": seq,
                        "time": t,
                        "gpus": gpus,
                        "host": {"cpu_percent": 10.0, "dram_used_bytes": 100 << 30},
                    }
                )
            client.hset(names.METRICS_LATEST_KEY, mapping=mapping)
            with engine.begin() as conn:
                conn.execute(db.update(Node).where(Node.name.in_(names_)).values(last_seen=datetime.now(UTC)))
            stop.wait(0.5)

    writer = threading.Thread(target=frames, daemon=True)
    writer.start()
    try:
        page = admin
        page.goto(fleet.base_url + "/#/fleet")  # type: ignore[attr-defined]
        paints, renders, draws = [], [], []
        for _ in range(3):
            page.reload()  # a fresh document each time: first paint is counted from its navigation
            page.wait_for_selector("#page-fleet[data-first-paint-ms]")
            # the first paint draws every card; tiles fill in slices after it, so wait for the last of them
            page.wait_for_function(
                "n => document.querySelectorAll('.gpu').length >= n", arg=n_nodes * n_gpus + 4
            )
            assert page.locator(".gpu").count() == n_nodes * n_gpus + 2 * 2
            paints.append(float(page.get_attribute("#page-fleet", "data-first-paint-ms") or "nan"))
            renders.append(float(page.get_attribute("#page-fleet", "data-render-ms") or "nan"))
            draws.append(float(page.get_attribute("#page-fleet", "data-first-draw-ms") or "nan"))
        # The best of three loads: on a small host shared with other suites, a load's time is mostly waiting for
        # the CPU; the least disturbed one shows what the page costs. All three are written to the figures.
        first_paint = min(paints)
        api_ms = page.evaluate(
            """() => Object.fromEntries(performance.getEntriesByType('resource')
                .filter(e => e.name.includes('/api/v1/'))
                .slice(0, 6).map(e => [new URL(e.name).pathname, Math.round(e.duration)]))"""
        )
        page.wait_for_function(
            "() => document.querySelector('#page-fleet').dataset.updates >= 15", timeout=60_000
        )
        updates = page.evaluate("performance.getEntriesByName('fleet-update').map(e => e.duration)")
        start_updates = int(page.get_attribute("#page-fleet", "data-updates") or 0)
        t0 = time.monotonic()
        page.wait_for_function(
            "n => document.querySelector('#page-fleet').dataset.updates >= n", arg=start_updates + 5
        )
        per_update_s = (time.monotonic() - t0) / 5
        figures = {
            "nodes": n_nodes,
            "gpus_per_node": n_gpus,
            "first_paint_ms": paints,
            "view_render_ms": renders,
            "first_draw_ms": draws,
            "api_ms_first_load": api_ms,
            "update_ms_median": statistics.median(updates),
            "update_ms_max": max(updates),
            "updates": len(updates),
            "seconds_between_updates": round(per_update_s, 3),
        }
        (artifacts / "fleet-200x8.json").write_text(json.dumps(figures, indent=1))
        print("fleet 200x8:", figures)
        page.screenshot(path=str(artifacts / "fleet-200x8.png"))
        assert first_paint < 1500, figures
        assert statistics.median(draws) < 1000, figures  # building 1600 tiles, in the page's own thread
        assert statistics.median(updates) < 500, figures
        assert per_update_s < 1.5, figures  # a frame a second, kept up with
    finally:
        stop.set()
        writer.join(5)
        client.hdel(names.METRICS_LATEST_KEY, *names_)
        db.session.execute(db.delete(Node).where(Node.name.in_(names_)))
        db.session.commit()


def test_screenshots_for_the_docs(artifacts: Path) -> None:
    """With GSWARM_UPDATE_DOCS=1, the pages the tests above took go to docs/images/dashboard/, where the docs' dashboard
    guide shows them; otherwise they must be there."""
    if os.environ.get("GSWARM_UPDATE_DOCS") != "1":
        missing = [name for name in DOCS_SCREENSHOTS.values() if not (DOCS / name).is_file()]
        assert missing == [], (
            f"{missing}: run `GSWARM_UPDATE_DOCS=1 pytest tests/integration/test_dashboard.py`"
        )
        return
    DOCS.mkdir(parents=True, exist_ok=True)
    for taken, name in DOCS_SCREENSHOTS.items():
        shutil.copy(artifacts / taken, DOCS / name)


def test_a_steps_status_change_reaches_the_page_through_the_event_stream(browser: Any, fleet: Fleet) -> None:
    """With the page's fallback poll set to ten minutes, a workflow submitted elsewhere still moves on its DAG as its
    steps change: what moves it is the event stream (/api/v1/events), within a second or two of each change."""
    base = fleet.base_url  # type: ignore[attr-defined]
    w = Watched(browser, base)
    page = w.page
    page.add_init_script("sessionStorage.setItem('gswarm.slowPollMs', '600000')")
    _sign_in(page, base, fleet.token)
    page.wait_for_selector("html[data-events=live]")
    doc = {"name": "dash-events", "actions": [
        {"action_id": "gate", "action_type": "noop", "duration_s": 3},
        {"action_id": "after", "action_type": "noop", "dependencies": ["gate"]},
    ]}  # fmt: skip
    code, wf = fleet.post("/workflows", doc)
    assert code == 201, wf
    page.goto(f"{base}/#/workflows/{wf['id']}")
    page.wait_for_selector('svg.dag g.step[data-step="gate"]')
    loads = len([u for u in w.requests if u.endswith(f"/api/v1/workflows/{wf['id']}")])
    page.wait_for_selector('svg.dag g.step[data-step="gate"][data-status="running"]', timeout=20_000)
    page.wait_for_selector('svg.dag g.step[data-step="after"][data-status="succeeded"]', timeout=20_000)
    shown = time.time()
    page.wait_for_selector('#page-workflows[data-status="succeeded"]', timeout=10_000)
    steps = {s["action_id"]: s for s in fleet.get(f"/workflows/{wf['id']}")[1]["steps"]}
    finished = datetime.fromisoformat(steps["after"]["finished_at"]).timestamp()
    assert shown - finished < 2.0, f"the page showed the end {shown - finished:.2f} s after it"
    reloads = len([u for u in w.requests if u.endswith(f"/api/v1/workflows/{wf['id']}")]) - loads
    assert 1 <= reloads <= 6, reloads  # one per burst of events (a few per step), no timer
    w.close()
