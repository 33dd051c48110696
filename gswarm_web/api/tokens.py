"""`/tokens`: admins create and revoke API tokens; `/tokens/self` tells any caller who it is."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import current_app, g
from flask.views import MethodView
from flask_smorest import Blueprint

from gswarm_tasks.errors import NotFound

from ..extensions import db
from ..tables import ApiToken
from .auth import ROLES, create_token, hash_token, revoke_token

blp = Blueprint("tokens", __name__, url_prefix="/api/v1", description="API tokens")


class TokenCreateSchema(ma.Schema):
    name = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=128))
    role = ma.fields.String(load_default="read-only", validate=ma.validate.OneOf(ROLES))
    models = ma.fields.List(
        ma.fields.String(validate=ma.validate.Length(min=1, max=200)),
        validate=ma.validate.Length(max=1000),
        metadata={
            "description": "an inference token's models: the gateway refuses the others (default: every one)"
        },
    )


class TokenSchema(ma.Schema):
    name = ma.fields.String()
    role = ma.fields.String()
    prefix = ma.fields.String()
    models = ma.fields.List(
        ma.fields.String(), allow_none=True, metadata={"description": "null: every model"}
    )
    created_at = ma.fields.DateTime()
    revoked_at = ma.fields.DateTime(allow_none=True)
    token = ma.fields.String(metadata={"description": "shown once, at creation"})


@blp.route("/tokens")
class Tokens(MethodView):
    @blp.response(200, TokenSchema(many=True))
    def get(self) -> list[ApiToken]:
        """List tokens (their prefixes, never the tokens); a read-only token sees only itself"""
        query = db.select(ApiToken).order_by(ApiToken.id)
        if g.get("role", "admin") != "admin":
            query = query.where(ApiToken.token_hash == g.get("token_hash"))
        return list(db.session.scalars(query))

    @blp.arguments(TokenCreateSchema)
    @blp.response(201, TokenSchema)
    def post(self, args: dict[str, Any]) -> ApiToken:
        """Create a token; the response is the only time it is shown"""
        token = create_token(args["name"], args["role"], args.get("models"))
        row = db.session.scalar(db.select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        row.token = token  # not a column: returned once, never stored
        return row


class WhoAmISchema(ma.Schema):
    name = ma.fields.String(metadata={"description": "the token's name"})
    role = ma.fields.String(metadata={"enum": list(ROLES)})
    can_write = ma.fields.Boolean(metadata={"description": "whether this token may call anything but reads"})


@blp.route("/tokens/self")
class TokenSelf(MethodView):
    @blp.response(200, WhoAmISchema)
    def get(self) -> dict[str, Any]:
        """Who the caller is: its token's name and role (what a client shows or hides)"""
        if not current_app.config.get("GSWARM_AUTH", True):
            return {"name": "anonymous", "role": "admin", "can_write": True}
        return {"name": g.token_name, "role": g.role, "can_write": g.role == "admin"}


@blp.route("/tokens/<string:prefix>")
class TokenByPrefix(MethodView):
    @blp.response(204)
    def delete(self, prefix: str) -> None:
        """Revoke the tokens that start with this prefix"""
        if revoke_token(prefix) == 0:
            raise NotFound(f"no active token with prefix {prefix!r}", {"prefix": prefix})
