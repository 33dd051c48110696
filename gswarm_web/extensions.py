"""Extensions of the control plane, created unbound here and bound in `create_app`: the database, the API, and
per-app clients of Redis and of the broker."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from flask import current_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import MetaData

from gswarm_tasks.celery_app import make_celery
from gswarm_tasks.settings import Settings

from .errors import GswarmApi

# Stable constraint names keep Alembic migrations identical on Postgres and SQLite.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

db = SQLAlchemy(metadata=MetaData(naming_convention=NAMING))
api = GswarmApi()


def settings() -> Settings:
    """The settings this app was made with."""
    value: Settings = current_app.config["GSWARM_SETTINGS"]
    return value


def redis_client() -> redis.Redis:
    """This app's Redis client (streams, progress, cancel marks, frames)."""
    client: Any = current_app.extensions.get("gswarm_redis")
    if client is None:
        client = redis.Redis.from_url(
            settings().effective_redis_url, socket_timeout=2, socket_connect_timeout=2
        )
        current_app.extensions["gswarm_redis"] = client
    return client


def sender() -> Celery:
    """The Celery app this Flask app sends with, configured from the same settings (not import-time env)."""
    app: Any = current_app.extensions.get("celery")
    if app is None:
        app = current_app.extensions["celery"] = make_celery(settings())
    return app
