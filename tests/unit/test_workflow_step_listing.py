"""`GET /workflows/{id}` builds its steps from the rows' columns (no ORM objects, no schema dump per step): the same
answer as StepSchema's dump of the steps, in chain order, every field's kind of value included (none, text, numbers,
times, placement from the parameters, outputs and errors)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import Flask
from flask.testing import FlaskClient

from gswarm_web.api.workflows import StepSchema
from gswarm_web.extensions import db
from gswarm_web.tables import TaskRecord, WorkflowRun
from tests.harness.app import bearer


def test_steps_are_the_schemas_dump(app: Flask, client: FlaskClient, admin_token: str) -> None:
    t0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    db.session.add(WorkflowRun(id="wf-1", name="w", status="running", document={}, started_at=t0))
    db.session.flush()  # the run before its steps (their foreign key)
    placement = {
        "target_device": {"chosen": "n1:gpu0", "candidates": [{"device": "n1:gpu0", "seconds": 1.5}]}
    }
    steps = [  # (segment, position, step, state, extra columns), inserted out of order
        (1, 0, "c", "pending", {"depends_on": ["a", "b"], "params": {"params": {}}}),
        (0, 1, "b", "succeeded", {"depends_on": ["a"], "started_at": t0, "finished_at": t0 + timedelta(seconds=2),
                                  "outputs": {"chunk_id": "x", "n": 3}, "attempts": 2, "device": "n1:dram"}),
        (0, 0, "a", "failed", {"depends_on": [], "error": {"code": "TASK_FAILED", "message": "no"}, "node": "n1",
                               "params": {"placement": placement, "params": {}}, "target_device": "n1:gpu0",
                               "source_device": "n2:disk", "priority": "high"}),
        (2, 0, "d", "skipped", {"depends_on": None, "params": {"placement": None}}),
    ]  # fmt: skip
    for seg, pos, sid, state, extra in steps:
        db.session.add(
            TaskRecord(id=f"t-{sid}", kind="noop", state=state, workflow_id="wf-1", step_id=sid, segment=seg,
                       position=pos, **{"params": {}, **extra})
        )  # fmt: skip
    db.session.commit()
    db.session.expire_all()
    query = db.select(TaskRecord).where(TaskRecord.workflow_id == "wf-1")
    orm = list(db.session.scalars(query.order_by(TaskRecord.segment, TaskRecord.position)))
    want = StepSchema(many=True).dump(orm)
    assert [s["action_id"] for s in want] == ["a", "b", "c", "d"] and want[0]["placement"] == placement

    got = client.get("/api/v1/workflows/wf-1", headers=bearer(admin_token))
    assert got.status_code == 200
    assert got.json["steps"] == want
    assert got.json["steps"][1]["started_at"] == "2026-01-02T03:04:05.678901+00:00"
    assert got.json["step_counts"] == {"failed": 1, "succeeded": 1, "pending": 1, "skipped": 1}
