"""`gswarm data ...` as a real subprocess against a real fleet: create, list, info, move, transfer, get, pins."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fleet import Fleet, running_fleet
from tests.harness.procs import wait_for

GSWARM = str(Path(sys.executable).with_name("gswarm"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("data_cli")
    (tmp / "allowed").mkdir()
    with running_fleet(tmp, extra_env={"GSWARM_MODELS_ALLOWED_ROOTS": str(tmp / "allowed")}) as f:
        yield f


@dataclass
class Result:
    rc: int
    raw: bytes
    err: str

    @property
    def out(self) -> str:
        return self.raw.decode(errors="replace")

    def __str__(self) -> str:  # for assertion messages
        return f"exit {self.rc}\n--- stdout ---\n{self.out[-3000:]}\n--- stderr ---\n{self.err[-3000:]}"


Cli = Callable[..., Result]


@pytest.fixture(scope="module")
def cli(fleet: Fleet) -> Cli:
    env = {**fleet.env, "GSWARM_API_URL": fleet.serve_http(), "GSWARM_TOKEN": fleet.token, "COLUMNS": "200"}

    def run(*args: str) -> Result:
        p = subprocess.run([GSWARM, "data", *args], env=env, capture_output=True, timeout=120)
        return Result(p.returncode, p.stdout, p.stderr.decode(errors="replace"))

    return run


def ok(r: Result) -> Result:
    assert r.rc == 0, str(r)
    assert "Traceback" not in r.err, str(r)
    return r


def refused(r: Result, rc: int = 1) -> Result:
    assert r.rc == rc, str(r)
    assert "Traceback" not in r.err, str(r)
    return r


def info(cli: Cli, chunk_id: str) -> Any:
    return json.loads(ok(cli("info", chunk_id, "--json")).out)


def devices(cli: Cli, chunk_id: str) -> list[str]:
    return sorted(loc["device"] for loc in info(cli, chunk_id)["locations"])


def test_a_chunk_through_every_command(fleet: Fleet, cli: Cli, tmp_path: Path) -> None:
    raw = os.urandom(300_000)
    src = tmp_path / "blob.bin"
    src.write_bytes(raw)

    # create from a local file (inline base64)
    meta = '{"owner": "cli-test"}'
    r = ok(
        cli(
            "create",
            "--file",
            str(src),
            "--device",
            "node1:disk",
            "--format",
            "bytes",
            "--metadata",
            meta,
            "--json",
        )
    )
    created = json.loads(r.out)
    cid = created["chunk_id"]
    assert (
        created["status"] == "available" and created["size"] == len(raw) and created["deduplicated"] is False
    )
    assert created["task_id"]
    assert (fleet.storage("node1") / "data" / cid).read_bytes() == raw

    # list: the table and the JSON, with filters
    r = ok(cli("list"))
    assert cid in r.out and "node1:disk" in r.out and "of 1 chunks" in r.out
    listed = json.loads(ok(cli("list", "--device", "node1:disk", "--type", "input", "--json")).out)
    assert [c["chunk_id"] for c in listed["chunks"]] == [cid] and listed["total"] == 1
    assert json.loads(ok(cli("list", "--device", "node2:disk", "--json")).out)["chunks"] == []
    assert json.loads(ok(cli("list", "--type", "output", "--json")).out)["total"] == 0

    # info: human and JSON
    r = ok(cli("info", cid))
    assert cid in r.out and "available" in r.out and "node1:disk" in r.out and '"owner": "cli-test"' in r.out
    ch = info(cli, cid)
    assert ch["format"] == "bytes" and ch["metadata"]["owner"] == "cli-test" and ch["metadata"]["checksum"]

    # move to a bare tier: the chunk's only node
    r = ok(cli("move", cid, "--to", "dram"))
    assert "data_move succeeded" in r.out and "node1:disk -> node1:dram" in r.out, str(r)
    assert devices(cli, cid) == ["node1:dram"]
    assert (fleet.dram("node1") / "data" / cid).read_bytes() == raw
    assert not (fleet.storage("node1") / "data" / cid).exists()

    # transfer to node2 (its dram by default): both copies
    r = ok(cli("transfer", cid, "--to", "node2"))
    assert "data_transfer succeeded" in r.out and "node1:dram -> node2:dram" in r.out, str(r)
    assert devices(cli, cid) == ["node1:dram", "node2:dram"]
    assert (fleet.dram("node2") / "data" / cid).read_bytes() == raw
    assert (fleet.dram("node1") / "data" / cid).read_bytes() == raw
    r = ok(cli("transfer", cid, "--to", "node2:dram"))
    assert "nothing to do" in r.out
    refused(cli("transfer", cid, "--to", "disk"), rc=2)

    # move to disk on node2; a bare tier is ambiguous now that two nodes hold it
    r = ok(cli("move", cid, "--to", "node2:disk"))
    assert "node2:dram -> node2:disk" in r.out, str(r)
    assert devices(cli, cid) == ["node1:dram", "node2:disk"]
    assert (fleet.storage("node2") / "data" / cid).read_bytes() == raw
    assert not (fleet.dram("node2") / "data" / cid).exists()
    assert "target_device" in refused(cli("move", cid, "--to", "disk")).err

    # get: to a file, to stdout, ranges
    out = tmp_path / "out.bin"
    r = ok(cli("get", cid, "-o", str(out)))
    assert out.read_bytes() == raw and f"wrote {len(raw)} bytes" in r.err
    assert ok(cli("get", cid)).raw == raw
    assert ok(cli("get", cid, "--range", "10-1009")).raw == raw[10:1010]
    assert ok(cli("get", cid, "--range", "299990-")).raw == raw[299_990:]
    assert ok(cli("get", cid, "--range", "-100", "-o", str(out))).raw == b""
    assert out.read_bytes() == raw[-100:]
    assert "outside" in refused(cli("get", cid, "--range", "400000-400010")).err
    refused(cli("get", cid, "--range", "9-3"), rc=2)
    refused(cli("get", cid, "--range", "x"), rc=2)
    assert info(cli, cid)["metadata"]["access_count"] >= 5

    # pins: a pinned chunk is not deleted without --force
    ok(cli("pin", cid))
    r = ok(cli("pin", cid, "--holder", "job7"))
    assert "pinned by job7" in r.out
    assert sorted(info(cli, cid)["references"]) == ["pin:api", "pin:job7"]
    r = refused(cli("delete", cid))
    assert "CONFLICT" in r.err and "referenced" in r.err, str(r)
    assert (fleet.dram("node1") / "data" / cid).exists() and (fleet.storage("node2") / "data" / cid).exists()
    assert info(cli, cid)["status"] == "available"
    ok(cli("unpin", cid))
    assert info(cli, cid)["references"] == ["pin:job7"]
    refused(cli("delete", cid))
    r = ok(cli("unpin", cid, "--holder", "job7"))
    assert "held by nobody" in r.out
    assert "NOT_FOUND" in refused(cli("unpin", cid, "--holder", "job7")).err

    # delete: every copy and the chunk go
    r = ok(cli("delete", cid))
    assert "deleted" in r.out and "2 copies removed" in r.out, str(r)
    wait_for(lambda: fleet.get(f"/data/{cid}")[0] == 404, 15, "the chunk to be gone")
    assert not (fleet.dram("node1") / "data" / cid).exists()
    assert not (fleet.storage("node2") / "data" / cid).exists()
    assert "NOT_FOUND" in refused(cli("info", cid)).err
    assert cid not in ok(cli("list")).out


def test_create_sources_dedup_and_refusals(fleet: Fleet, cli: Cli, tmp_path: Path) -> None:
    # a file:// source under an allowed root
    src = fleet.tmp / "allowed" / "rows.jsonl"
    src.write_text('{"text": "hello"}\n{"text": "world"}\n')
    r = ok(cli("create", "--source", f"file://{src}", "--device", "node2:disk", "--type", "intermediate"))
    assert "data_create succeeded" in r.out, str(r)
    [ch] = json.loads(ok(cli("list", "--type", "intermediate", "--json")).out)["chunks"]
    assert ch["status"] == "available" and ch["locations"][0]["device"] == "node2:disk"
    assert (fleet.storage("node2") / "data" / ch["chunk_id"]).read_text() == src.read_text()

    # base64 bytes; the same bytes again on the same device: a chunk of its own, sharing the bytes
    payload = base64.b64encode(b"same bytes\n" * 100).decode()
    first = json.loads(ok(cli("create", "--data-b64", payload, "--device", "node1:dram", "--json")).out)
    again = json.loads(ok(cli("create", "--data-b64", payload, "--device", "node1:dram", "--json")).out)
    assert again["deduplicated"] is True and again["chunk_id"] != first["chunk_id"]
    r = ok(cli("create", "--data-b64", payload, "--device", "node1:dram"))
    assert "deduplicated" in r.out
    a, b = (fleet.dram("node1") / "data" / c["chunk_id"] for c in (first, again))
    assert a.read_bytes() == b.read_bytes() == b"same bytes\n" * 100 and a.stat().st_ino == b.stat().st_ino

    # --no-wait returns at once; the chunk becomes available by itself
    r = ok(
        cli(
            "create",
            "--data-b64",
            base64.b64encode(b"later").decode(),
            "--device",
            "node2:dram",
            "--no-wait",
            "--json",
        )
    )
    later = json.loads(r.out)
    assert later["task_id"] and later["deduplicated"] is False
    wait_for(
        lambda: fleet.get(f"/data/{later['chunk_id']}")[1]["status"] == "available", 30, "the chunk stored"
    )
    assert (fleet.dram("node2") / "data" / later["chunk_id"]).read_bytes() == b"later"

    # refusals: exactly one source, a JSON object for metadata, the server's checks named by field
    refused(cli("create", "--device", "node1:dram"), rc=2)
    refused(cli("create", "--data-b64", payload, "--source", f"file://{src}", "--device", "node1:dram"), rc=2)
    refused(cli("create", "--data-b64", payload, "--device", "node1:dram", "--metadata", "[1]"), rc=2)
    refused(cli("create", "--data-b64", payload, "--device", "node1:dram", "--metadata", "{nope"), rc=2)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    r = refused(cli("create", "--source", f"file://{outside}", "--device", "node1:dram"))
    assert "INVALID_REQUEST" in r.err and "source" in r.err, str(r)
    r = refused(cli("create", "--data-b64", payload, "--device", "node1:gpu0"))
    assert "device" in r.err, str(r)
    assert "NOT_FOUND" in refused(cli("move", "no-such-chunk", "--to", "node1:disk")).err

    # a copy whose bytes changed on disk is caught by `get` and no output file is left
    stored = fleet.storage("node2") / "data" / ch["chunk_id"]
    stored.write_bytes(stored.read_bytes().upper())
    out = tmp_path / "bad.jsonl"
    r = refused(cli("get", ch["chunk_id"], "-o", str(out)))
    assert "sha256 mismatch" in r.err, str(r)
    assert not out.exists() and not list(tmp_path.glob(".bad.jsonl.*"))
