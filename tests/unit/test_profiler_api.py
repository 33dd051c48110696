"""The profiler's endpoints on SQLite and fakeredis: sessions named when no name is given, imports (refusals name
their field and change nothing; frames go in time order), paged exports of an imported session, recovery."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import pytest
from flask import Flask
from flask.testing import FlaskClient

from gswarm_tasks import names
from tests.harness.app import bearer

HEAD = {"start_time": "2030-01-01T00:00:00+00:00", "end_time": "2030-01-01T00:10:00+00:00", "freq_ms": 1000}


@pytest.fixture
def api(app: Flask, client: FlaskClient, admin_token: str) -> Any:
    app.extensions["gswarm_redis"] = fakeredis.FakeRedis()

    def call(method: str, path: str, body: Any = None, **query: Any) -> tuple[int, Any]:
        r = client.open(
            f"/api/v1{path}", method=method, json=body, query_string=query, headers=bearer(admin_token)
        )
        return r.status_code, r.get_json()

    return call


def frame(t: float, node: str = "host-a", util: float = 50.0) -> dict[str, Any]:
    gpus = [{"index": 0, "name": "G", "utilization_percent": util, "memory_percent": 10.0}]
    return {"node": node, "time": t, "gpus": gpus, "host": {"cpu_percent": 5.0}}


T0 = 1893456000.0  # 2030-01-01


def test_a_session_without_a_name_gets_one(api: Any, app: Flask) -> None:
    code, s = api("POST", "/profiler/sessions", {"freq_ms": 500})
    assert code == 201 and s["name"].startswith("session_") and s["status"] == "active", s
    code, again = api("POST", "/profiler/sessions", {"freq_ms": 500})
    assert code == 201 and again["name"] != s["name"]  # the same second: a suffix
    assert app.extensions["gswarm_redis"].hexists(names.PROFILER_SESSIONS_KEY, s["name"])


def test_a_session_start_and_stop_are_announced_to_the_samplers(api: Any, app: Flask) -> None:
    client = app.extensions["gswarm_redis"]
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(names.channel(names.PROFILER_SESSIONS_CHANNEL, client))
    assert api("POST", "/profiler/sessions", {"name": "told", "freq_ms": 200})[0] == 201
    assert api("POST", "/profiler/sessions/told/stop", {})[0] == 200
    told, deadline = [], time.monotonic() + 5
    while len(told) < 2 and time.monotonic() < deadline:
        m = pubsub.get_message(timeout=0.5)
        if m is not None:
            told.append(m["data"])
    assert told == [b"told", b"told"]
    assert not app.extensions["gswarm_redis"].hexists(names.PROFILER_SESSIONS_KEY, "told")


def test_import_refusals_name_the_field_and_change_nothing(api: Any) -> None:
    body = {"name": "imp", "nodes": ["host-a"], **HEAD}
    code, err = api("POST", "/profiler/imports", {**body, "colour": "red"})
    assert code == 422 and "colour" in err["error"]["details"]["fields"]
    code, err = api("POST", "/profiler/imports", {**body, "end_time": "2029-01-01T00:00:00+00:00"})
    assert code == 422 and "end_time" in err["error"]["details"]["fields"]
    code, err = api("POST", "/profiler/imports", {**body, "nodes": ["bad host"]})
    assert code == 422 and "nodes.0" in err["error"]["details"]["fields"]
    assert api("GET", "/profiler/sessions/imp")[0] == 404
    assert api("POST", "/profiler/imports", body)[0] == 201
    code, err = api("POST", "/profiler/imports/imp/frames", {"frames": [frame(-1.0)]})
    assert code == 422 and "frames.0.time" in err["error"]["details"]["fields"]
    code, err = api("POST", "/profiler/imports/imp/frames", {"frames": [frame(1e300)]})
    assert code == 422 and "frames.0.time" in err["error"]["details"]["fields"]
    code, err = api("POST", "/profiler/imports/imp/frames", {"frames": [frame(T0, node="host-b")]})
    assert code == 422 and err["error"]["details"]["field"] == "frames[0].node"
    code, err = api("POST", "/profiler/imports/imp/frames", {"frames": [frame(T0 + 2), frame(T0 + 1)]})
    assert code == 422 and err["error"]["details"]["field"] == "frames[1].time"
    assert api("POST", "/profiler/imports/imp/frames", {"frames": [frame(T0 + 1)]})[0] == 200
    code, err = api("POST", "/profiler/imports/imp/frames", {"frames": [frame(T0)]})  # before the one sent
    assert code == 422 and err["error"]["details"]["field"] == "frames[0].time"
    assert api("POST", "/profiler/imports/ghost/frames", {"frames": [frame(T0)]})[0] == 404


def test_an_import_exports_in_pages_like_a_stopped_session(api: Any) -> None:
    assert api("POST", "/profiler/imports", {"name": "imp", "nodes": ["host-a", "host-b"], **HEAD})[0] == 201
    frames = [frame(T0 + i * 0.5, node, util=float(i)) for i in range(200) for node in ("host-a", "host-b")]
    for i in range(0, 400, 150):
        code, out = api("POST", "/profiler/imports/imp/frames", {"frames": frames[i : i + 150]})
        assert code == 200 and out["frames"] == len(frames[i : i + 150])
    code, s = api("POST", "/profiler/imports/imp/finish")
    assert (
        code == 200 and s["status"] == "imported" and s["host_frame_count"] == 400 and s["frame_count"] == 400
    )
    assert s["summary_by_device"]["host-a:0:G"]["gpu_util"]["max"] == 199.0
    assert api("POST", "/profiler/imports/imp/frames", {"frames": [frame(T0 + 500)]})[0] == 409
    assert api("POST", "/profiler/imports", {"name": "imp", "nodes": ["host-a"], **HEAD})[0] == 409
    rows, cursor, pages = [], None, 0
    while True:
        code, page = api("GET", "/profiler/sessions/imp/export", **({"cursor": cursor} if cursor else {}))
        assert code == 200, page
        rows += page["host_frames"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 1 and len(rows) == 400  # 800 readings: one page of the default 100,000
    assert [r["frame_id"] for r in rows] == list(range(400))
    assert page["summary_by_device"] == s["summary_by_device"]
    assert api("GET", "/profiler/sessions/imp/export", cursor="x" * 10)[0] == 422
    code, whole = api("GET", "/profiler/sessions/imp/export", all="true")  # one streamed document
    assert code == 200 and whole["host_frames"] == rows and whole["next_cursor"] is None
    assert whole["summary_by_device"] == s["summary_by_device"] and len(whole["frames"]) == 400
    code, err = api("GET", "/profiler/sessions/imp/export", all="true", cursor=cursor or "c")
    assert code == 422 and "cursor" in err["error"]["details"]["fields"]


def test_recover_lists_and_resumes_active_sessions_only(api: Any, app: Flask) -> None:
    code, s = api("POST", "/profiler/sessions", {"name": "live", "freq_ms": 500})
    assert code == 201
    app.extensions["gswarm_redis"].hdel(names.PROFILER_SESSIONS_KEY, "live")  # Redis lost it
    code, rows = api("GET", "/profiler/recover")
    assert code == 200 and [r["name"] for r in rows] == ["live"]
    assert rows[0]["published"] is False and rows[0]["frames"] == 0
    assert any("not published" in why for why in rows[0]["interrupted"])
    assert any("no archiver" in why for why in rows[0]["interrupted"])
    code, resumed = api("POST", "/profiler/recover", {"name": "live"})
    assert code == 200 and [r["name"] for r in resumed] == ["live"]
    assert app.extensions["gswarm_redis"].hexists(names.PROFILER_SESSIONS_KEY, "live")
    assert api("POST", "/profiler/sessions/live/stop")[0] == 200
    code, err = api("POST", "/profiler/recover", {"name": "live"})
    assert code == 409 and err["error"]["details"]["field"] == "name"
    assert api("POST", "/profiler/recover", {"name": "live", "extra": 1})[0] == 422
