"""What the dashboard stands on, without a browser (SQLite app): its files served without a token and from this
host only, GET /tokens/self for each role, the workflow examples, and Swagger UI's assets from the package."""

from __future__ import annotations

import re
from pathlib import Path

from flask.testing import FlaskClient

from gswarm_web.api.auth import create_token
from tests.harness.app import bearer

STATIC = Path(__file__).resolve().parents[2] / "gswarm_web" / "dashboard" / "static"


def test_the_page_and_its_modules_are_served_without_a_token_and_name_only_this_host(
    client: FlaskClient,
) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.mimetype == "text/html"
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    html = r.get_data(as_text=True)
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "the page names another host"
    for ref in re.findall(r"(?:src|href)=\"(/dashboard/static/[^\"]+)\"", html):
        assert client.get(ref).status_code == 200, ref
    for js in STATIC.joinpath("js").rglob("*.js"):
        text = js.read_text().replace('"http://www.w3.org/2000/svg"', "")  # a namespace, not a request
        assert "http://" not in text and "https://" not in text, f"{js} names another host"
        for imported in re.findall(r"from \"(\.[^\"]+)\"", text):
            assert (js.parent / imported).resolve().is_file(), f"{js} imports {imported}"
    assert client.get("/api/v1/nodes").status_code == 401  # the API still wants a token


def test_tokens_self_tells_each_role_who_it_is(
    client: FlaskClient, admin_token: str, read_token: str
) -> None:
    r = client.get("/api/v1/tokens/self", headers=bearer(admin_token))
    assert r.status_code == 200 and r.get_json() == {"name": "test-admin", "role": "admin", "can_write": True}
    r = client.get("/api/v1/tokens/self", headers=bearer(read_token))
    assert r.get_json() == {"name": "test-reader", "role": "read-only", "can_write": False}
    inference = create_token("gw", "inference")
    assert client.get("/api/v1/tokens/self", headers=bearer(inference)).status_code == 403
    r = client.get("/api/v1/tokens/self")
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "UNAUTHORIZED"


def test_workflow_examples_are_the_packaged_ones_and_validate(client: FlaskClient, read_token: str) -> None:
    from gswarm_web.workflows.examples import EXAMPLES, ORDER, RUNNABLE

    r = client.get("/api/v1/workflows/examples", headers=bearer(read_token))
    assert r.status_code == 200
    examples = r.get_json()["examples"]
    assert [e["name"] for e in examples] == list(ORDER)
    for e in examples:
        assert e["original"] == EXAMPLES[e["name"]] and e["runnable"] == RUNNABLE[e["name"]]


def test_swagger_ui_comes_from_the_package_with_its_version_and_licence(client: FlaskClient) -> None:
    html = client.get("/api/v1/docs").get_data(as_text=True)
    assets = re.findall(r"(?:src|href)=\"([^\"]+)\"", html)
    assert assets and all(a.startswith("/dashboard/static/vendor/swagger-ui/") for a in assets), assets
    for a in assets:
        assert client.get(a).status_code == 200, a
    vendor = STATIC / "vendor" / "swagger-ui"
    assert (
        "5.35.0" in (vendor / "VERSION").read_text() and "Apache License" in (vendor / "LICENSE").read_text()
    )
