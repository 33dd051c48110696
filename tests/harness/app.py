"""Settings in a temporary home, the app on them, and the header a token is sent in."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from gswarm_tasks.settings import Settings, load_settings


def make_settings(home: Path, **env: str) -> Settings:
    base = {"GSWARM_HOME": str(home), "GSWARM_CONFIG": ""}
    base.update(env)
    return load_settings(base)


def build_app(settings: Settings) -> Flask:
    from gswarm_web import create_app
    from gswarm_web.migrate import upgrade

    upgrade(settings.effective_database_url)
    return create_app(settings)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
