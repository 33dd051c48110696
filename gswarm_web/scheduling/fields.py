"""Typed reads of user input that raise InvalidRequest naming the field, so the API can answer 422."""

from __future__ import annotations

import math
from typing import Any

from gswarm_tasks.errors import InvalidRequest


def refuse(field: str, message: str, value: Any = None) -> InvalidRequest:
    """The error for a bad field: its message starts with the field path."""
    details: dict[str, Any] = {"field": field}
    if value is not None and isinstance(value, str | int | float | bool):
        details["value"] = value
    return InvalidRequest(f"{field}: {message}", details)


def mapping(value: Any, field: str) -> dict[str, Any]:
    """`value` if it is a JSON object with string keys."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise refuse(field, "must be an object")
    return value


def sequence(value: Any, field: str) -> list[Any]:
    """`value` if it is a JSON array."""
    if not isinstance(value, list):
        raise refuse(field, "must be a list")
    return value


def text(value: Any, field: str) -> str:
    """`value` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise refuse(field, "must be a non-empty string", value)
    return value


def number(value: Any, field: str, *, positive: bool = False, default: float | None = None) -> float:
    """`value` as a finite float, at least 0 (above 0 when `positive`); `default` when it is absent."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise refuse(field, "must be a number", value)
    if value < 0 or (positive and value == 0):
        raise refuse(field, f"must be {'above' if positive else 'at least'} 0", value)
    return float(value)


def integer(value: Any, field: str, *, minimum: int = 0, default: int | None = None) -> int:
    """`value` as an int of at least `minimum`; `default` when it is absent."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(field, "must be an integer", value)
    if value < minimum:
        raise refuse(field, f"must be at least {minimum}", value)
    return value


def choice(value: Any, field: str, options: tuple[str, ...], default: str | None = None) -> str:
    """`value` if it is one of `options`; `default` when it is absent."""
    if value is None and default is not None:
        return default
    if value not in options:
        raise refuse(field, f"must be one of {', '.join(options)}", value if isinstance(value, str) else None)
    return str(value)


def no_extra(doc: dict[str, Any], field: str, allowed: tuple[str, ...]) -> None:
    """Refuse keys of `doc` outside `allowed` (a typo would otherwise be ignored silently)."""
    for key in doc:
        if key not in allowed:
            raise refuse(f"{field}.{key}", f"unknown field (expected one of {', '.join(allowed)})")
