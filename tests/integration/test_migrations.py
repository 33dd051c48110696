"""Migrations go up and down on Postgres and SQLite, and match the models exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from gswarm_web import tables  # noqa: F401
from gswarm_web.extensions import db
from gswarm_web.migrate import current_revision, downgrade, head_revision, upgrade

TABLES = {"nodes", "node_gpus", "api_tokens"}


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _diff(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(
                compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), db.metadata)
            )
    finally:
        engine.dispose()


@pytest.fixture(params=["postgres", "sqlite"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'm.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_upgrade_downgrade_upgrade(any_url: str) -> None:
    upgrade(any_url)
    assert current_revision(any_url) == head_revision()
    assert TABLES <= _tables(any_url)
    downgrade(any_url, "base")
    assert current_revision(any_url) is None
    assert _tables(any_url) == set()
    upgrade(any_url)
    assert TABLES <= _tables(any_url)


def test_models_and_migrations_agree(any_url: str) -> None:
    upgrade(any_url)
    assert _diff(any_url) == []
