"""The error shape of every error, and bearer-token auth (SQLite app, no broker needed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.harness.app import bearer


def assert_error_shape(body: dict[str, Any], code: str) -> dict[str, Any]:
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"code", "message", "details", "timestamp", "request_id"}
    assert err["code"] == code
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["details"], dict)
    assert datetime.fromisoformat(err["timestamp"]).utcoffset().total_seconds() == 0
    assert err["request_id"]
    return err


def test_no_token_is_401(client: FlaskClient) -> None:
    r = client.get("/api/v1/nodes")
    assert r.status_code == 401
    assert_error_shape(r.json, "UNAUTHORIZED")


def test_wrong_token_is_401(client: FlaskClient, admin_token: str) -> None:
    r = client.get("/api/v1/nodes", headers=bearer(admin_token + "x"))
    assert r.status_code == 401
    assert_error_shape(r.json, "UNAUTHORIZED")


def test_read_only_token_reads_but_cannot_write(client: FlaskClient, read_token: str) -> None:
    assert client.get("/api/v1/nodes", headers=bearer(read_token)).status_code == 200
    r = client.post("/api/v1/tokens", json={"name": "x"}, headers=bearer(read_token))
    assert r.status_code == 403
    assert_error_shape(r.json, "FORBIDDEN")


def test_admin_token_writes(client: FlaskClient, admin_token: str) -> None:
    r = client.post("/api/v1/tokens", json={"name": "ci", "role": "read-only"}, headers=bearer(admin_token))
    assert r.status_code == 201
    new = r.json["token"]
    assert client.get("/api/v1/nodes", headers=bearer(new)).status_code == 200
    # A revoked token stops working.
    assert client.delete(f"/api/v1/tokens/{new[:10]}", headers=bearer(admin_token)).status_code == 204
    assert client.get("/api/v1/nodes", headers=bearer(new)).status_code == 401


def test_fixed_admin_token_from_settings(settings: Any) -> None:
    from tests.harness.app import build_app

    app = build_app(settings)
    app.config["GSWARM_ADMIN_TOKEN"] = "fixed-secret-token-of-32-chars-x"
    with app.app_context():
        c = app.test_client()
        assert c.get("/api/v1/nodes", headers=bearer("fixed-secret-token-of-32-chars-x")).status_code == 200
        assert c.get("/api/v1/nodes", headers=bearer("fixed-secret-token-of-32-chars-X")).status_code == 401


def test_404_shape(client: FlaskClient, admin_token: str) -> None:
    r = client.get("/api/v1/no-such-thing", headers=bearer(admin_token))
    assert r.status_code == 404
    assert_error_shape(r.json, "NOT_FOUND")
    r = client.get("/api/v1/nodes/ghost", headers=bearer(admin_token))
    assert r.status_code == 404
    assert "ghost" in assert_error_shape(r.json, "NOT_FOUND")["message"]


def test_405_shape(client: FlaskClient, admin_token: str) -> None:
    r = client.put("/api/v1/nodes", headers=bearer(admin_token))
    assert r.status_code == 405
    err = assert_error_shape(r.json, "INVALID_REQUEST")
    assert "GET" in err["details"]["allowed_methods"]


def test_422_names_the_field(client: FlaskClient, admin_token: str) -> None:
    r = client.get("/api/v1/nodes?page=0", headers=bearer(admin_token))
    assert r.status_code == 422
    err = assert_error_shape(r.json, "INVALID_REQUEST")
    assert "page" in err["details"]["fields"] and "page" in err["message"]
    r = client.post("/api/v1/tokens", json={"role": "root"}, headers=bearer(admin_token))
    assert r.status_code == 422
    err = assert_error_shape(r.json, "INVALID_REQUEST")
    assert set(err["details"]["fields"]) == {"name", "role"}


def test_bad_node_name_in_path_is_422(client: FlaskClient, admin_token: str) -> None:
    r = client.get("/api/v1/nodes/Bad_Name", headers=bearer(admin_token))
    assert r.status_code == 422
    assert_error_shape(r.json, "INVALID_REQUEST")


def test_500_has_the_shape_and_no_stack_trace(app: Flask, admin_token: str) -> None:
    def boom() -> str:
        raise RuntimeError("secret internals at /srv/x.py line 3")

    app.add_url_rule("/api/v1/_boom", "boom", boom)
    r = app.test_client().get("/api/v1/_boom", headers=bearer(admin_token))
    assert r.status_code == 500
    assert_error_shape(r.json, "INTERNAL")
    text = r.get_data(as_text=True)
    assert "Traceback" not in text and "secret internals" not in text


def test_request_id_is_echoed(client: FlaskClient) -> None:
    r = client.get("/api/v1/nodes", headers={"X-Request-ID": "abc-123"})
    assert r.headers["X-Request-ID"] == "abc-123"
    assert r.json["error"]["request_id"] == "abc-123"


def test_openapi_and_docs_are_public_and_document_errors(client: FlaskClient) -> None:
    spec = client.get("/api/v1/openapi.json").json
    assert "/api/v1/nodes" in spec["paths"]
    assert "Error" in spec["components"]["schemas"]
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert client.get("/api/v1/docs").status_code == 200


def test_a_page_past_the_end_is_an_empty_page_and_a_huge_one_is_refused(
    client: FlaskClient, admin_token: str
) -> None:
    for path in (
        "/api/v1/models",
        "/api/v1/nodes",
        "/api/v1/data",
        "/api/v1/workflows",
        "/api/v1/queue/tasks",
    ):
        r = client.get(f"{path}?page=999999", headers=bearer(admin_token))
        assert r.status_code == 200, (path, r.json)
        assert r.json["total"] == 0 and r.json["page"] == 999999
        assert [v for k, v in r.json.items() if isinstance(v, list)] == [[]]
        r = client.get(f"{path}?page=100000000000000000", headers=bearer(admin_token))
        assert r.status_code == 422, (path, r.json)
        assert "page" in assert_error_shape(r.json, "INVALID_REQUEST")["details"]["fields"]


def test_unknown_fields_with_any_characters_are_named_in_the_body_never_in_a_header(
    client: FlaskClient, admin_token: str
) -> None:
    for name in ("bad\nfield", "名前", "x\r\nSet-Cookie: a=b"):
        r = client.post("/api/v1/tokens", json={"name": "t", name: 1}, headers=bearer(admin_token))
        assert r.status_code == 422
        assert name in assert_error_shape(r.json, "INVALID_REQUEST")["details"]["fields"]
        assert all(name not in value for value in r.headers.values())
        assert "X-Invalid-Fields" not in r.headers


def test_a_nul_character_anywhere_is_refused_naming_where(client: FlaskClient, admin_token: str) -> None:
    r = client.get("/api/v1/workflows?name=a%00b", headers=bearer(admin_token))
    assert (
        r.status_code == 422 and assert_error_shape(r.json, "INVALID_REQUEST")["details"]["field"] == "name"
    )
    r = client.post("/api/v1/tokens", json={"name": "a\x00b"}, headers=bearer(admin_token))
    assert r.status_code == 422 and r.json["error"]["details"]["field"] == "name"


@pytest.mark.parametrize(
    "path", ["/api/v1/tokens", "/api/v1/data", "/api/v1/scheduling/simulate", "/v1/embeddings"]
)
def test_a_number_past_pythons_digit_bound_is_400_and_digits_in_strings_are_fine(
    client: FlaskClient, admin_token: str, path: str
) -> None:
    huge = "7" * 5000
    r = client.post(path, data='{"name": "x", "n": ' + huge + '}', headers=bearer(admin_token),
                    content_type="application/json")  # fmt: skip
    assert r.status_code == 400 and r.json["error"]["details"] == {"field": "body", "max_digits": 4300}, (
        r.json
    )
    from gswarm_web.api.limits import number_too_long

    assert number_too_long(('{"n": ' + huge + "}").encode())
    assert not number_too_long(
        ('{"n": "' + huge + '", "m": "a\\"' + huge + '"}').encode()
    )  # text, not numbers


def test_health_without_a_token_names_no_worker_and_no_error_text(
    app: Flask, client: FlaskClient, admin_token: str
) -> None:
    anonymous = client.get("/api/v1/health")
    assert anonymous.status_code == 503  # the broker of this app (127.0.0.1:1) does not answer
    body = anonymous.json
    assert body["broker"] == {"ok": False, "error": "ConnectionError"} and body["workers"]["control"] == 0
    detailed = client.get("/api/v1/health", headers=bearer(admin_token)).json
    assert (
        detailed["broker"]["error"].startswith("ConnectionError: ")
        and "127.0.0.1" in detailed["broker"]["error"]
    )
    assert detailed["workers"]["control"] == []
