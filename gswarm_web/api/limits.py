"""Bodies that cannot exhaust a worker: JSON nested deeper than MAX_JSON_DEPTH is refused (400, the error shape)
before anything parses it, since every JSON reader of the API (Flask's, webargs', the NUL check) recurses. The depth
is found without recursion and in C loops: strings cut out, brackets kept as +1/-1 bytes, their running sum's
maximum taken; a body with few brackets costs two counts. The gateway's fast path reads its bodies before Flask
does and is left as it is (a body it cannot read falls through to its Flask view, which this check guards)."""

from __future__ import annotations

import re
import sys
from array import array
from itertools import accumulate

from flask import Flask, request

from gswarm_tasks.errors import InvalidRequest

MAX_JSON_DEPTH = 64
_ESCAPE_RE = re.compile(rb"\\.", re.S)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 and, as a signed byte, -1


class TooDeep(InvalidRequest):
    """A body nested past the bound: a 400, the request is malformed for this API whatever its fields."""

    status = 400


def json_depth_over(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests arrays and objects deeper than `limit` (unclosed ones count too)."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    outside = _outside_strings(data)  # what lies between strings
    return max(accumulate(array("b", outside.translate(_STEPS, _NOT_BRACKETS))), default=0) > limit


MAX_DIGITS = (
    sys.get_int_max_str_digits() or 4300
)  # Python's bound on int(str): past it a parse raises ValueError
_LONG_NUMBER_RE = re.compile(rb"[0-9]{%d}" % (MAX_DIGITS + 1))


def _outside_strings(data: bytes) -> bytes:
    if b"\\" in data:
        data = _ESCAPE_RE.sub(b"", data)  # an escaped quote neither opens nor closes a string
    return b"".join(data.split(b'"')[::2])


def number_too_long(data: bytes) -> bool:
    """Whether JSON text holds a number of more digits than Python parses (digits inside strings do not count)."""
    return (
        _LONG_NUMBER_RE.search(data) is not None
        and _LONG_NUMBER_RE.search(_outside_strings(data)) is not None
    )


def refuse_deep_json() -> None:
    if not request.is_json:
        return
    data = request.get_data(cache=True)
    if json_depth_over(data):
        raise TooDeep(
            f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels is not accepted",
            {"field": "body", "max_depth": MAX_JSON_DEPTH},
        )
    if number_too_long(data):
        raise TooDeep(
            f"body: a number of more than {MAX_DIGITS} digits", {"field": "body", "max_digits": MAX_DIGITS}
        )


def limit_json_depth(app: Flask) -> None:
    """Run the check before every other hook (the NUL check and the views parse the body recursively)."""
    app.before_request_funcs.setdefault(None, []).insert(0, refuse_deep_json)
