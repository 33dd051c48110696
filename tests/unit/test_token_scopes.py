"""Tokens: an inference token may be scoped to models (the gateway refuses the others); only an inference token
takes a scope; a read-only token lists only itself."""

from __future__ import annotations

from flask.testing import FlaskClient

from tests.harness.app import bearer


def test_an_inference_token_scoped_to_models(client: FlaskClient, admin_token: str) -> None:
    r = client.post("/api/v1/tokens", json={"name": "app", "role": "inference", "models": ["minilm", "minilm"]},
                    headers=bearer(admin_token))  # fmt: skip
    assert r.status_code == 201 and r.json["models"] == ["minilm"], r.json
    scoped = r.json["token"]
    r = client.post("/v1/embeddings", json={"model": "other", "input": "x"}, headers=bearer(scoped))
    assert r.status_code == 403 and r.json["error"]["details"] == {"field": "model", "models": ["minilm"]}
    r = client.post("/v1/embeddings", json={"model": "minilm", "input": "x"}, headers=bearer(scoped))
    assert (
        r.status_code == 404 and r.json["error"]["code"] == "MODEL_NOT_FOUND"
    )  # allowed, just not served here
    r = client.get("/v1/models", headers=bearer(scoped))
    assert r.status_code == 200 and r.json["data"] == []
    listed = client.get("/api/v1/tokens", headers=bearer(admin_token)).json
    assert [t["models"] for t in listed if t["name"] == "app"] == [["minilm"]]
    assert [t["models"] for t in listed if t["name"] == "test-admin"] == [None]


def test_only_an_inference_token_takes_models(client: FlaskClient, admin_token: str) -> None:
    for role in ("admin", "read-only"):
        r = client.post(
            "/api/v1/tokens", json={"name": "x", "role": role, "models": ["m"]}, headers=bearer(admin_token)
        )
        assert r.status_code == 422 and r.json["error"]["details"]["field"] == "models", r.json
    names = [t["name"] for t in client.get("/api/v1/tokens", headers=bearer(admin_token)).json]
    assert "x" not in names


def test_a_read_only_token_lists_only_itself(client: FlaskClient, admin_token: str, read_token: str) -> None:
    mine = client.get("/api/v1/tokens", headers=bearer(read_token)).json
    assert [t["name"] for t in mine] == ["test-reader"]
    assert len(client.get("/api/v1/tokens", headers=bearer(admin_token)).json) >= 2
