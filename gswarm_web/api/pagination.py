"""`page` / `per_page` for every list, with `total` in the body, as the original API promised.

`per_page` is bounded, and a `page` past the end is an empty page: the offset is capped before it reaches the
database (SQLite's integers are 64-bit; an unbounded page number overflowed them).
"""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from sqlalchemy import Select, func

from ..extensions import db

MAX_PAGE = 1_000_000_000


class PageArgsSchema(ma.Schema):
    page = ma.fields.Integer(load_default=1, validate=ma.validate.Range(min=1, max=MAX_PAGE))
    per_page = ma.fields.Integer(load_default=20, validate=ma.validate.Range(min=1, max=500))


def paginate(query: Select[Any], page: int, per_page: int) -> tuple[list[Any], int]:
    """(the items of one page, the total); a page past the end is empty."""
    total = int(db.session.scalar(db.select(func.count()).select_from(query.order_by(None).subquery())) or 0)
    offset = (page - 1) * per_page
    if offset >= total:
        return [], total
    return list(db.session.scalars(query.limit(per_page).offset(offset))), total


def page_of(key: str, query: Select[Any], args: dict[str, Any]) -> dict[str, Any]:
    """The body of a list answer: `{key: [...], total, page, per_page}`."""
    items, total = paginate(query, args["page"], args["per_page"])
    return {key: items, "total": total, "page": args["page"], "per_page": args["per_page"]}


class PageSchema(ma.Schema):
    """What every list answer carries besides its items."""

    total = ma.fields.Integer()
    page = ma.fields.Integer()
    per_page = ma.fields.Integer()
