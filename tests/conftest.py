"""Fixtures shared by unit and integration tests: settings in a temporary home, the app, tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from gswarm_tasks.settings import Settings
from tests.harness.app import build_app, make_settings


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture(scope="module")
def redis_db() -> Iterator[int]:
    """A Redis database of this module's own on the test Redis (tests/harness/redis_db.py): empty when claimed,
    flushed and released after the module. Fleets claim their own (tests/harness/fleet.py)."""
    from tests.harness.redis_db import free_redis_db

    with free_redis_db() as db:
        yield db


@pytest.fixture
def settings(home: Path) -> Settings:
    return make_settings(home, GSWARM_REDIS_URL="redis://127.0.0.1:1/0")


@pytest.fixture
def app(settings: Settings) -> Iterator[Flask]:
    app = build_app(settings)
    with app.app_context():
        yield app
        from gswarm_web.extensions import db

        db.session.remove()
        db.engine.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def admin_token(app: Flask) -> str:
    from gswarm_web.api.auth import create_token

    return create_token("test-admin", "admin")


@pytest.fixture
def read_token(app: Flask) -> str:
    from gswarm_web.api.auth import create_token

    return create_token("test-reader", "read-only")
