"""What a request to the built-in server may send: its inputs as strings, bounded in count and in characters."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest

# A request's text is bounded as its count of inputs is: tokenizing a 60 MiB string took minutes and gigabytes,
# and held the replica (and its node's memory) for every other request. The models truncate far below these.
MAX_INPUT_CHARS = 100_000
MAX_REQUEST_CHARS = 1_000_000
MAX_BODY_BYTES = 16 * 1024 * 1024


def bounded(items: list[str], key: str) -> list[str]:
    """`items` when each is at most MAX_INPUT_CHARS characters and all together MAX_REQUEST_CHARS, else 422."""
    for i, text in enumerate(items):
        if len(text) > MAX_INPUT_CHARS:
            where = key if len(items) == 1 else f"{key}[{i}]"
            details = {"field": where, "chars": len(text), "max_input_chars": MAX_INPUT_CHARS}
            raise InvalidRequest(
                f"'{where}' has {len(text)} characters; at most {MAX_INPUT_CHARS} per input", details
            )
    total = sum(len(t) for t in items)
    if total > MAX_REQUEST_CHARS:
        details = {"field": key, "chars": total, "max_request_chars": MAX_REQUEST_CHARS}
        raise InvalidRequest(
            f"'{key}' has {total} characters; at most {MAX_REQUEST_CHARS} per request", details
        )
    return items


def strings(body: dict[str, Any], key: str, max_items: int) -> list[str]:
    value = body.get(key)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(s, str) and s for s in items):
        raise InvalidRequest(
            f"'{key}' must be a non-empty string or a non-empty list of them", {"field": key}
        )
    if len(items) > max_items:
        details = {"field": key, "count": len(items), "max_batch_size": max_items}
        raise InvalidRequest(f"'{key}' has {len(items)} items; at most {max_items} per request", details)
    return bounded(items, key)
