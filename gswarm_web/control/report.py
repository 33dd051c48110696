"""One node report as the intake reads it from the reports stream (written by `gswarm_tasks.reporting.report`)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Report:
    kind: str
    id: str
    event: str
    time: float
    data: dict[str, Any] = field(default_factory=dict)
    workflow_id: str | None = None


def parse_reports(entries: list[tuple[Any, dict[Any, Any]]]) -> list[Report]:
    """Reports from stream entries, in stream order; a malformed entry is logged and dropped."""
    out: list[Report] = []
    for entry_id, fields in entries:
        raw = fields.get(b"event", fields.get("event"))
        try:
            doc = json.loads(raw)  # type: ignore[arg-type]
            data = doc.get("data") or {}
            if not isinstance(data, dict):
                raise ValueError("data is not an object")
            out.append(
                Report(
                    kind=str(doc["kind"]),
                    id=str(doc["id"]),
                    event=str(doc["event"]),
                    time=float(doc["time"]),
                    data=data,
                    workflow_id=doc.get("workflow_id"),
                )
            )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            log.warning("dropping malformed report %r: %s", entry_id, exc)
    return out
