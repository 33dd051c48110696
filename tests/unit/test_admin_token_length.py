"""An admin token has at least 32 characters: a shorter GSWARM_ADMIN_TOKEN stops start-up, 32 works."""

from __future__ import annotations

from pathlib import Path

import pytest

from gswarm_tasks.errors import ConfigError, InvalidRequest
from gswarm_tasks.settings import Settings
from tests.harness.app import bearer, build_app, make_settings

T31 = "a" * 31
T32 = "b" * 32


def test_a_configured_admin_token_of_31_characters_stops_start_up(home: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        make_settings(home, GSWARM_ADMIN_TOKEN=T31)
    assert exc.value.details == {"field": "GSWARM_ADMIN_TOKEN"}
    assert "31 characters" in exc.value.message and "at least 32" in exc.value.message


def test_config_file_admin_token_is_checked_too(home: Path) -> None:
    (home / "config.yaml").write_text(f"auth:\n  admin_token: {T31}\n")
    with pytest.raises(ConfigError):
        make_settings(home, GSWARM_CONFIG=str(home / "config.yaml"))


def test_an_app_built_with_a_short_admin_token_refuses_to_start(settings: Settings) -> None:
    from gswarm_web import create_app

    with pytest.raises(ConfigError, match="at least 32"):
        create_app({"GSWARM_ADMIN_TOKEN": T31, "SQLALCHEMY_DATABASE_URI": settings.effective_database_url})


def test_admin_token_of_32_characters_is_accepted_and_31_is_not(home: Path) -> None:
    app = build_app(make_settings(home, GSWARM_ADMIN_TOKEN=T32, GSWARM_REDIS_URL="redis://127.0.0.1:1/0"))
    with app.app_context():
        c = app.test_client()
        assert c.get("/api/v1/nodes", headers=bearer(T32)).status_code == 200
        assert c.get("/api/v1/nodes", headers=bearer(T32[:31])).status_code == 401
        # Set past the start-up check, straight into the config: a short fixed token still opens nothing.
        app.config["GSWARM_ADMIN_TOKEN"] = T31
        r = c.get("/api/v1/nodes", headers=bearer(T31))
        assert r.status_code == 401 and r.json["error"]["code"] == "UNAUTHORIZED"


def test_a_short_admin_token_is_not_recorded(settings: Settings) -> None:
    from gswarm_web.api.auth import ensure_token, identity_of

    app = build_app(settings)
    with app.app_context():
        with pytest.raises(InvalidRequest) as exc:
            ensure_token("short", T31, "admin")
        assert exc.value.details["field"] == "token"
        assert identity_of(T31) is None
        ensure_token("long", T32, "admin")
        assert identity_of(T32)[:2] == ("admin", "long")
