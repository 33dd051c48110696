"""Reading the scheduler's files (config, trace, fleet, schedules): JSON by json, YAML by libyaml's C parser.

A 22,500-step trace is a 1.6 MB file: PyYAML's pure-Python loader took 5 s on it and its C loader 1.3 s (most of it
building nodes and running the generic constructor in Python). Here JSON goes to `json.loads` (JSON is YAML, so a
file that looks like JSON is tried as JSON first), and YAML is built straight from the C parser's events, without
recursion: aliases, anchors, merge keys and tags other than the plain ones are refused, as for workflow documents,
nesting is bounded, and one document only. Scalars mean what `yaml.safe_load` makes of them (an unquoted
timestamp is a datetime), each distinct plain scalar resolved once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from .fields import refuse

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 64
_YAML = "tag:yaml.org,2002:"
_STR = _YAML + "str"
_SCALARS = {_YAML + t for t in ("str", "int", "float", "bool", "null", "timestamp")}
_COLLECTIONS = {None, "!", _YAML + "map", _YAML + "seq"}


class _Refused(Exception):
    """A construct the reader does not take, with the line it is on."""

    def __init__(self, why: str, event: Any) -> None:
        mark = getattr(event, "start_mark", None) or getattr(event, "problem_mark", None)
        super().__init__(why + (f" (line {mark.line + 1})" if mark is not None else ""))


class _Scalars:
    """Plain scalars to values as the safe loader reads them, each distinct text resolved and constructed once."""

    def __init__(self, loader: Any, json_values: bool = False) -> None:
        self.loader = loader
        self.plain: dict[str, Any] = {}
        self.json_values = json_values  # only values JSON has: a timestamp stays its text, a float is finite

    def value(self, ev: yaml.ScalarEvent) -> Any:
        if ev.tag in (None, "!"):
            if not ev.style and ev.implicit[0]:  # plain (the C parser says so with "")
                try:
                    return self.plain[ev.value]
                except KeyError:
                    tag = self.loader.resolve(yaml.ScalarNode, ev.value, (True, False))
                    value = self.plain[ev.value] = self._construct(ev, tag)
                    return value
            return ev.value  # quoted or block text: a string
        return self._construct(ev, ev.tag)

    def _construct(self, ev: yaml.ScalarEvent, tag: str) -> Any:
        if tag == _STR:
            return ev.value
        if tag == _YAML + "merge":
            raise _Refused("merge keys (<<) are not allowed", ev)
        if tag not in _SCALARS:
            raise _Refused(f"the tag {tag} is not allowed", ev)
        if self.json_values and tag == _YAML + "timestamp":
            return ev.value
        value = self.loader.yaml_constructors[tag](
            self.loader, yaml.ScalarNode(tag, ev.value, style=ev.style or None)
        )
        if self.json_values and isinstance(value, float) and not math.isfinite(value):
            raise _Refused(f"{ev.value!r} is not a finite number", ev)
        return value


def _build(loader: Any, json_values: bool = False) -> Any:
    """The document from the parser's events: containers on an explicit stack, so any nesting up to MAX_DEPTH."""
    scalars = _Scalars(loader, json_values)
    stack: list[tuple[Any, list[Any]]] = []  # (container, [pending key] for mappings)
    root: Any = None
    documents = 0
    get_event = loader.get_event
    scalar_event, alias_event = yaml.ScalarEvent, yaml.AliasEvent
    ends = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    while loader.check_event():
        ev = get_event()
        cls = type(ev)
        if cls is scalar_event:
            if ev.anchor is not None:
                raise _Refused(f"anchors (&{ev.anchor}) are not allowed", ev)
            value: Any = scalars.value(ev)
        elif cls in ends:
            stack.pop()
            continue
        elif cls is yaml.MappingStartEvent or cls is yaml.SequenceStartEvent:
            if ev.anchor is not None:
                raise _Refused(f"anchors (&{ev.anchor}) are not allowed", ev)
            if ev.tag not in _COLLECTIONS:
                raise _Refused(f"the tag {ev.tag} is not allowed", ev)
            if len(stack) >= MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", ev)
            value = {} if cls is yaml.MappingStartEvent else []
        elif cls is alias_event:
            raise _Refused(f"aliases (*{ev.anchor}) are not allowed", ev)
        elif cls is yaml.DocumentStartEvent:
            documents += 1
            if documents > 1:
                raise _Refused("one document only (found a second `---`)", ev)
            continue
        else:
            continue  # stream start and end, document end
        if not stack:
            root = value
        else:
            parent, key = stack[-1]
            if type(parent) is list:
                parent.append(value)
            elif not key:
                if type(value) is not str:
                    raise _Refused("mapping keys must be strings", ev)
                key.append(value)
            else:
                parent[key.pop()] = value
        if type(value) is dict or type(value) is list:
            stack.append((value, []))
    return root


def parse_yaml(text: str | bytes, json_values: bool = False) -> Any:
    """A YAML (or JSON) text as plain data; raises yaml.YAMLError or ValueError saying what is wrong and where.
    `json_values`: only values JSON has (a timestamp stays its text, `.nan` and `.inf` are refused)."""
    loader = _Loader(text)
    try:
        return _build(loader, json_values)
    except _Refused as exc:
        raise ValueError(str(exc)) from None
    except yaml.MarkedYAMLError as exc:
        # libyaml 0.2.6 and later guard their own depth (1,000 levels), and their scanner reads a flow collection
        # ahead of the events: such a document is refused here as the bound below would refuse it.
        if "nesting" in (exc.problem or ""):
            raise ValueError(str(_Refused(f"nested deeper than {MAX_DEPTH} levels", exc))) from None
        raise
    finally:
        loader.dispose()


def _looks_like_json(text: str) -> bool:
    head = text.lstrip()[:1]
    return head in ("{", "[")


def read_document(path: str | Path) -> Any:
    """A JSON or YAML file as plain data; a file that cannot be read is refused naming it."""
    p = Path(path)
    try:
        raw = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise refuse(str(p), f"cannot be read: {exc}") from exc
    if p.suffix == ".json" or _looks_like_json(raw):
        try:
            return json.loads(raw)
        except RecursionError:
            raise refuse(str(p), "cannot be parsed: nested too deeply") from None
        except json.JSONDecodeError as exc:
            if p.suffix == ".json":
                raise refuse(str(p), f"cannot be parsed: {str(exc).splitlines()[0]}") from exc
            # YAML's flow style looks like JSON and is not: read as YAML below
    try:
        return parse_yaml(raw)
    except (yaml.YAMLError, ValueError) as exc:
        raise refuse(str(p), f"cannot be parsed: {str(exc).splitlines()[0]}") from exc
