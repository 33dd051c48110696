"""The control plane: the Flask app factory (`create_app`); the API (`api`), its bookkeeping (`control`), workflows,
scheduling, the control worker (`celery_app`) and the CLI (`cli`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gswarm_tasks.settings import Settings, load_settings

if TYPE_CHECKING:
    from flask import Flask

# Flask and SQLAlchemy are imported by create_app, not here: a command that needs neither (`gswarm schedule ...`)
# does not pay for importing them.


def flask_config(settings: Settings) -> dict[str, Any]:
    from .dashboard import SWAGGER_UI_URL

    url = settings.effective_database_url
    engine_options: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        from .sqlite import ENGINE_OPTIONS

        engine_options.update(ENGINE_OPTIONS)
    else:
        engine_options.update(pool_size=5, max_overflow=10, pool_recycle=1800)
        # psycopg prepares a statement after a few runs, and Postgres may then keep one generic plan for it,
        # chosen while the tables were small: `checksum IN (...)` kept scanning the whole chunk table and grew
        # from 15 to 450 ms at 30,000 chunks (bench/chunks.py). Plans for the values at hand, always.
        engine_options["connect_args"] = {"options": "-c plan_cache_mode=force_custom_plan"}
    return {
        "GSWARM_SETTINGS": settings,
        "GSWARM_ADMIN_TOKEN": settings.admin_token,
        "SQLALCHEMY_DATABASE_URI": url,
        "SQLALCHEMY_ENGINE_OPTIONS": engine_options,
        "API_TITLE": "gswarm",
        "API_VERSION": "v1",
        "OPENAPI_VERSION": "3.0.3",
        "OPENAPI_URL_PREFIX": "/api/v1",
        "OPENAPI_JSON_PATH": "openapi.json",
        "OPENAPI_SWAGGER_UI_PATH": "docs",
        "OPENAPI_SWAGGER_UI_URL": SWAGGER_UI_URL,  # vendored: the docs work on an air-gapped cluster
        "OPENAPI_SWAGGER_UI_CONFIG": {"validatorUrl": None},  # no badge fetched from validator.swagger.io
        "API_SPEC_OPTIONS": {
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}],
            "info": {"description": "GPU-fleet manager: nodes, models, data, workflows and profiling."},
        },
        "MAX_CONTENT_LENGTH": 64 * 1024 * 1024,
    }


def create_app(config: Settings | dict[str, Any] | None = None) -> Flask:
    """Build the control-plane app from settings (default: loaded from config file and environment)."""
    from flask import Flask
    from sqlalchemy import event

    from .api import BLUEPRINTS
    from .api.auth import init_auth
    from .api.limits import limit_json_depth
    from .api.original import bp as original_paths
    from .api.strict import refuse_unknown_input, strict_query_strings
    from .dashboard import bp as dashboard
    from .errors import register_error_handlers
    from .extensions import api, db

    settings = config if isinstance(config, Settings) else load_settings()
    app = Flask(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config.update(flask_config(settings))
    if isinstance(config, dict):
        app.config.update(config)
    logging.getLogger("gswarm_web").setLevel(settings.log_level.upper())

    db.init_app(app)
    with app.app_context():
        if db.engine.dialect.name == "sqlite":
            from .sqlite import pragmas

            event.listen(db.engine, "connect", pragmas)
    api.init_app(app)
    app.extensions["gswarm_api"] = api
    register_error_handlers(app)
    limit_json_depth(app)  # before every hook that parses JSON
    init_auth(app)
    strict_query_strings()
    for blp in BLUEPRINTS:
        api.register_blueprint(blp)
    refuse_unknown_input(app, {blp.name for blp in BLUEPRINTS})
    app.register_blueprint(dashboard)
    app.register_blueprint(original_paths)  # after the workflows blueprint: its aliases name that one's views
    from .api.events import init_events
    from .control.events import install as publish_changes

    init_events(app)  # the WebSocket at /api/v1/events
    publish_changes()
    from .api.bodies import BodyGuard
    from .api.gateway import FastPath

    app.wsgi_app = BodyGuard(app, FastPath(app))  # type: ignore[method-assign]
    return app


__all__ = ["create_app"]
