"""`page` / `per_page` pagination with `total` in the body, as the original API promised."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from sqlalchemy import Select, func

from .extensions import db


class PageArgsSchema(ma.Schema):
    page = ma.fields.Integer(load_default=1, validate=ma.validate.Range(min=1))
    per_page = ma.fields.Integer(load_default=20, validate=ma.validate.Range(min=1, max=500))


def paginate(query: Select[Any], page: int, per_page: int) -> tuple[list[Any], int]:
    total = db.session.scalar(db.select(func.count()).select_from(query.order_by(None).subquery())) or 0
    items = list(db.session.scalars(query.limit(per_page).offset((page - 1) * per_page)))
    return items, int(total)
