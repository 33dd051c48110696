"""Transfer benchmark: gswarm's model copies and data-pool transfers against `cp` and `curl`, in one run.

models (the model pool):
1. same-node `disk -> dram` copy of a ~1 GiB model through the API and a real node worker, vs `cp -r`;
2. cross-node copy `node1:disk -> node2:disk` over loopback (two real node workers), vs `curl` of the same file
   from `python -m http.server` (issue 13's baseline) and from nginx with sendfile (the physical limit, when
   Debian's nginx is installed).
Each timing runs from the POST to the moment the API reports the task succeeded (verified and recorded).
chunks (the data pool):
3. `POST /data/{id}/transfer` of a 1 GiB random chunk `node1:disk -> node2:disk`, vs `curl` of the same file
   from `python -m http.server` and from nginx; timed from the POST until `GET /data/{id}` lists an `available`
   copy on node2:disk (verified and recorded). Every repeat transfers a fresh chunk created from the same file.
Prints medians and the ratio baseline_time / gswarm_time (>= 1 means gswarm is as fast); the goals are issue 13's.
The sides of each repeat run in rotated order, each after `sync` (see `rotations`).
compression (the node-to-node stream):
5. the cross-node copy of a compressible (half its bytes zero, as sparse or low-precision weights) and of an
   incompressible (random) model, `compression: none` vs `zstd`: time from the POST to the recorded copy and
   the bytes that crossed the wire (`wire_bytes` of the task's result), medians of --repeat.
small (the data pool):
4. 10,000 distinct 4 KiB chunks created with base64 `POST /data` on node1:dram, sequentially through the
   Flask test client and then from a thread pool of HTTP clients; chunks/s for the submission and for the
   whole run until every chunk is `available`.

    python bench/transfer.py [--only models,chunks,small,compression] [--size-mib 1024] [--chunk-mib 1024] [--repeat 6]
                             [--streams N] [--small-count 10000] [--small-threads 4]
                             [--profile DIR [--profile-format raw]]

`--profile DIR` records py-spy on both node workers (main process and pool) during every gswarm transfer.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import pwd
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Profiles, cpu_seconds  # noqa: E402
from tests.harness.fleet import Fleet, sha256  # noqa: E402
from tests.harness.procs import wait_for  # noqa: E402

BENCHES = ("models", "chunks", "small", "compression")


def make_model(root: Path, size_mib: int) -> Path:
    d = root / "bench-model"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "bench", "hidden_size": 1024}))
    with open(d / "model.safetensors", "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(size_mib):
            f.write(block[i % 251 :] + block[: i % 251])
    return d


def make_random_file(path: Path, size_mib: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(0, size_mib, 16):
            f.write(os.urandom(min(16, size_mib) << 20))
        f.truncate(size_mib << 20)
    return path


NODE_TIMES: list[float] = []
CHUNK_NODE_TIMES: list[float] = []
PROFILES = Profiles(None)
PIDS: dict[str, int] = {}


def run_copy(fleet: Fleet, body: dict[str, str]) -> float:
    t0 = time.perf_counter()
    code, task = fleet.post("/models/bench/copy", body)
    assert code == 202, task

    def done() -> bool:
        code, t = fleet.get(f"/queue/tasks/{task['task_id']}")
        if t["status"] == "failed":
            raise SystemExit(f"copy failed: {t['error']}")
        if t["status"] == "succeeded":
            NODE_TIMES.append(t["result"]["elapsed_s"])
        return bool(t["status"] == "succeeded")

    wait_for(done, 300, "the copy", interval=0.01)
    return time.perf_counter() - t0


def drop(fleet: Fleet, device: str) -> None:
    code, task = fleet.api("DELETE", f"/models/bench/locations/{device}")
    assert code == 202, task
    wait_for(lambda: fleet.get(f"/queue/tasks/{task['task_id']}")[1]["status"] == "succeeded", 60, "delete")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(port: int, probe: str, what: str) -> None:
    url = f"http://127.0.0.1:{port}/{probe}"
    wait_for(lambda: subprocess.run(["curl", "-sfI", "-o", "/dev/null", url]).returncode == 0, 10, what)


def http_server(directory: Path, probe: str) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m http.server` on `directory`, once it answers for `probe`."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_http(port, probe, "http.server")
    return server, port


def nginx_server(directory: Path, probe: str, work: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """Debian's nginx serving `directory` with sendfile, unprivileged and in the foreground (the physical limit
    of serving a file over HTTP here); None when nginx is not installed (`apt-get install nginx-light`)."""
    exe = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if exe is None:
        return None
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    temp = " ".join(f"{k}_temp_path {work};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        # `user`: the workers read as the bench's own user (it matters only when that is root: the fleet's
        # directories are private to it)
        f"daemon off; worker_processes 1; user {pwd.getpwuid(os.geteuid()).pw_name};\n"
        f"pid {work}/nginx.pid; error_log {work}/error.log;\n"
        "events { worker_connections 64; }\n"
        f"http {{ access_log off; sendfile on; tcp_nopush on; {temp}\n"
        f"  server {{ listen 127.0.0.1:{port}; root {directory}; }} }}\n"
    )
    server = subprocess.Popen(
        [exe, "-p", str(work), "-c", str(work / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(port, probe, "nginx")
    except BaseException:
        server.terminate()
        server.wait()
        raise
    return server, port


def timed_curl(port: int, name: str, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["curl", "-sf", "-o", str(out), f"http://127.0.0.1:{port}/{name}"], check=True)
    elapsed = time.perf_counter() - t0
    out.unlink()
    return elapsed


def mib_label(mib: int) -> str:
    return f"{mib >> 10} GiB" if mib % 1024 == 0 else f"{mib} MiB"


def rotations(repeat: int, sides: int) -> list[list[int]]:
    """The order of the sides in each repeat, rotated so that every side goes first as often as the others.

    Freshly written pages cost this host's kernel very different amounts of time from one run to the next
    (the copy into the page cache, not the network, is what varies); rotating spreads that over every side."""
    return [[(i + k) % sides for k in range(sides)] for i in range(repeat)]


def row(name: str, size: int, ours: list[float], base: list[float], goal: float) -> dict[str, object]:
    g, b = statistics.median(ours), statistics.median(base)
    return {
        "case": name,
        "gswarm_s": round(g, 3),
        "baseline_s": round(b, 3),
        "gswarm_MB_per_s": round(size / g / 1e6, 1),
        "baseline_MB_per_s": round(size / b / 1e6, 1),
        "ratio": round(b / g, 2),
        "goal": goal,
        "pass": b / g >= goal,
        "gswarm_samples_s": [round(x, 3) for x in ours],
        "baseline_samples_s": [round(x, 3) for x in base],
    }


# ---- models -------------------------------------------------------------------------------------------------


def bench_models(fleet: Fleet, src_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    src = make_model(src_root, args.size_mib)
    fleet.register_and_download("bench", f"file://{src}")
    stored = fleet.storage("node1") / "models" / "bench"
    size = sum(
        p.stat().st_size for p in stored.rglob("*") if p.is_file() and not p.name.startswith(".gswarm")
    )
    subprocess.run(["cat", str(stored / "model.safetensors")], stdout=subprocess.DEVNULL, check=True)

    def timed_cp(dest: Path) -> float:
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(stored), str(dest)], check=True)
        return time.perf_counter() - t0

    server, port = http_server(stored, "config.json")
    try:
        nginx = nginx_server(stored, "config.json", fleet.tmp / "nginx-models")
    except BaseException:
        server.terminate()
        raise
    remote_nginx: list[float] = []
    try:
        # Alternate which side goes first, and flush dirty pages before every timed run, so that neither side
        # pays for the other's writeback.
        local_g, local_cp, remote_g, remote_curl = [], [], [], []
        for i in range(args.repeat):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                os.sync()
                if side == 0:
                    local_g.append(
                        run_copy(fleet, {"source_device": "node1:disk", "target_device": "node1:dram"})
                    )
                    drop(fleet, "node1:dram")
                else:
                    dest = fleet.dram_base / "cp-baseline"
                    local_cp.append(timed_cp(dest))
                    shutil.rmtree(dest)
        out = fleet.storage("node2") / "curl-baseline.bin"
        for i, order in enumerate(rotations(args.repeat, 3 if nginx else 2)):
            for side in order:
                os.sync()
                if side == 0:
                    with PROFILES.record(f"transfer-models-{i}", PIDS):
                        remote_g.append(
                            run_copy(fleet, {"source_device": "node1:disk", "target_device": "node2:disk"})
                        )
                    drop(fleet, "node2:disk")
                elif side == 1:
                    remote_curl.append(timed_curl(port, "model.safetensors", out))
                elif nginx:
                    remote_nginx.append(timed_curl(nginx[1], "model.safetensors", out))
    finally:
        for proc in (server, nginx[0] if nginx else None):
            if proc is not None:
                proc.terminate()
                proc.wait()
    rows = [
        row("same-node disk->dram vs cp", size, local_g, local_cp, 0.9),
        row(f"{mib_label(args.size_mib)} model copy across nodes vs curl", size, remote_g, remote_curl, 0.9),
    ]
    case = f"{mib_label(args.size_mib)} model copy across nodes vs curl from nginx"
    limit = [row(case, size, remote_g, remote_nginx, 0)] if nginx else []
    return {"bytes": size, "repeat": args.repeat, "results": rows, "limits": limit, "node_side_s": NODE_TIMES}


# ---- chunks -------------------------------------------------------------------------------------------------


def create_chunk(fleet: Fleet, src: Path) -> str:
    code, body = fleet.post("/data", {"source": f"file://{src}", "device": "node1:disk", "type": "input"})
    assert code == 202, body
    task = fleet.wait_task(body["task_id"], 300)
    assert task["status"] == "succeeded", task
    return str(body["chunk_id"])


STUCK_ROWS: list[str] = []


def delete_chunk(fleet: Fleet, chunk_id: str) -> None:
    """Delete a chunk and wait until its files are gone and no location is left.

    A row left `deleting` with no location counts as gone (and is listed in the summary): when the deletes of
    two copies are recorded at the same moment, neither removes the row."""
    code, body = fleet.api("DELETE", f"/data/{chunk_id}")
    assert code == 202, body
    for tid in body["tasks"]:
        assert fleet.wait_task(tid, 60)["status"] == "succeeded"

    def gone() -> bool:
        code, c = fleet.get(f"/data/{chunk_id}")
        return code == 404 or (c["status"] == "deleting" and not c["locations"] and time.monotonic() > until)

    until = time.monotonic() + 5
    wait_for(gone, 30, f"chunk {chunk_id} to be gone")
    if fleet.get(f"/data/{chunk_id}")[0] == 200:
        STUCK_ROWS.append(chunk_id)


def run_transfer(fleet: Fleet, chunk_id: str, node: str, tier: str) -> float:
    """Seconds from the POST until the chunk has an available copy on node:tier, as `GET /data/{id}` lists it.

    The poll (every 20 ms) reads the one row that GET reads: a full GET every 10 ms takes a good part of a
    core from the workers on a small machine. The GET then confirms it."""
    from gswarm_web.extensions import db
    from gswarm_web.tables import ChunkLocation, DataChunk

    device = f"{node}:{tier}"
    t0 = time.perf_counter()
    code, op = fleet.post(f"/data/{chunk_id}/transfer", {"target_node": node, "target_device": tier})
    assert code == 202 and not op["noop"], op

    def done() -> bool:
        db.session.remove()
        row = db.session.execute(
            db.select(ChunkLocation.status, DataChunk.status_message)
            .select_from(DataChunk)
            .outerjoin(
                ChunkLocation, (ChunkLocation.chunk_id == DataChunk.id) & (ChunkLocation.device == device)
            )
            .where(DataChunk.id == chunk_id)
        ).one()
        if (row[1] or "").startswith("data_transfer"):
            raise SystemExit(f"transfer failed: {row[1]}")
        return row[0] == "available"

    wait_for(done, 600, f"chunk {chunk_id} on {device}", interval=0.02)
    elapsed = time.perf_counter() - t0
    code, c = fleet.get(f"/data/{chunk_id}")
    assert any(loc["device"] == device and loc["status"] == "available" for loc in c["locations"]), c
    task = fleet.get(f"/queue/tasks/{op['task_id']}")[1]
    assert task["status"] == "succeeded", task
    CHUNK_NODE_TIMES.append(task["result"]["elapsed_s"])
    return elapsed


def bench_chunks(fleet: Fleet, src_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    src = make_random_file(src_root / "chunk-src" / "chunk.bin", args.chunk_mib)
    size = src.stat().st_size
    want = sha256(src)
    server, port = http_server(src.parent, src.name)
    try:
        nginx = nginx_server(src.parent, src.name, fleet.tmp / "nginx-chunks")
    except BaseException:
        server.terminate()
        raise
    workers = [psutil.Process(fleet.procs[n].pid) for n in ("control", "node1", "node2")]
    baseline = [psutil.Process(server.pid)]

    def cpu(procs: list[psutil.Process]) -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # curl, once it has been waited for
        return sum(cpu_seconds(p) for p in procs) + kids.ru_utime + kids.ru_stime

    ours, curl, ours_cpu, curl_cpu, via_nginx = [], [], [], [], []
    out = fleet.storage("node2") / "curl-baseline.bin"
    try:
        for i, order in enumerate(rotations(args.repeat, 3 if nginx else 2)):
            chunk_id = create_chunk(fleet, src)  # a fresh chunk each time: only the transfer is timed
            for side in order:
                os.sync()
                if side == 0:
                    with PROFILES.record(f"transfer-chunks-{i}", PIDS):
                        c0 = cpu(workers)
                        ours.append(run_transfer(fleet, chunk_id, "node2", "disk"))
                        ours_cpu.append(cpu(workers) - c0)
                    copy = fleet.storage("node2") / "data" / chunk_id
                    assert copy.stat().st_size == size, copy
                    if i == 0:
                        assert sha256(copy) == want, "the node2 copy differs from the source"
                elif side == 1:
                    c0 = cpu(baseline)
                    curl.append(timed_curl(port, src.name, out))
                    curl_cpu.append(cpu(baseline) - c0)
                elif nginx:
                    via_nginx.append(timed_curl(nginx[1], src.name, out))
            delete_chunk(fleet, chunk_id)
    finally:
        for proc in (server, nginx[0] if nginx else None):
            if proc is not None:
                proc.terminate()
                proc.wait()
    rows = [row(f"{mib_label(args.chunk_mib)} chunk node1:disk -> node2:disk vs curl", size, ours, curl, 0.9)]
    case = f"{mib_label(args.chunk_mib)} chunk node1:disk -> node2:disk vs curl from nginx"
    limit = [row(case, size, ours, via_nginx, 0)] if nginx else []
    return {
        "bytes": size,
        "repeat": args.repeat,
        "results": rows,
        "limits": limit,
        "node_side_s": CHUNK_NODE_TIMES,
        # CPU seconds while each side ran: the three workers (gswarm), http.server and curl (baseline)
        "gswarm_cpu_s": [round(x, 2) for x in ours_cpu],
        "baseline_cpu_s": [round(x, 2) for x in curl_cpu],
        "rows_left_deleting": STUCK_ROWS,
    }


# ---- compression --------------------------------------------------------------------------------------------


def make_weights(root: Path, name: str, size_mib: int, compressible: bool) -> Path:
    """A model of `size_mib` MiB of fresh random bytes; `compressible`: every other byte zero."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "bench", "hidden_size": 1024}))
    with open(d / "model.safetensors", "wb") as f:
        for _ in range(size_mib):
            block = bytearray(1 << 20)
            if compressible:
                block[0::2] = os.urandom(1 << 19)
            else:
                block[:] = os.urandom(1 << 20)
            f.write(block)
    return d


def timed_copy(fleet: Fleet, model: str, compression: str) -> tuple[float, int]:
    """(seconds from the POST until the copy is recorded, bytes on the wire) of one node1 -> node2 copy."""
    t0 = time.perf_counter()
    body = {"source_device": "node1:disk", "target_device": "node2:disk", "compression": compression}
    code, task = fleet.post(f"/models/{model}/copy", body)
    assert code == 202, task
    done = wait_for(
        lambda: (t := fleet.get(f"/queue/tasks/{task['task_id']}")[1])["status"] in ("succeeded", "failed") and t,
        600, "the copy", interval=0.02,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    if done["status"] != "succeeded":
        raise SystemExit(f"copy failed: {done['error']}")
    code, drop_task = fleet.api("DELETE", f"/models/{model}/locations/node2:disk")
    assert code == 202, drop_task
    wait_for(
        lambda: fleet.get(f"/queue/tasks/{drop_task['task_id']}")[1]["status"] == "succeeded", 60, "delete"
    )
    return elapsed, int(done["result"]["wire_bytes"])


def bench_compression(fleet: Fleet, src_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name, compressible in (("compressible", True), ("incompressible", False)):
        src = make_weights(src_root, f"zbench-{name}", args.size_mib, compressible)
        fleet.register_and_download(f"zbench-{name}", f"file://{src}")
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        times: dict[str, list[float]] = {"none": [], "zstd": []}
        wire: dict[str, int] = {}
        for order in rotations(args.repeat, 2):
            for side in order:
                mode = ("none", "zstd")[side]
                os.sync()
                elapsed, wire[mode] = timed_copy(fleet, f"zbench-{name}", mode)
                times[mode].append(elapsed)
        none_s, zstd_s = statistics.median(times["none"]), statistics.median(times["zstd"])
        rows.append({
            "case": f"{mib_label(args.size_mib)} {name} model, node1:disk -> node2:disk",
            "bytes": size,
            "none_s": round(none_s, 3),
            "zstd_s": round(zstd_s, 3),
            "none_wire_bytes": wire["none"],
            "zstd_wire_bytes": wire["zstd"],
            "wire_ratio": round(wire["zstd"] / wire["none"], 3),
            "time_ratio": round(zstd_s / none_s, 2),
            "none_samples_s": [round(x, 3) for x in times["none"]],
            "zstd_samples_s": [round(x, 3) for x in times["zstd"]],
        })  # fmt: skip
    return {"repeat": args.repeat, "results": rows}


# ---- small chunks -------------------------------------------------------------------------------------------


def small_bodies(count: int, tag: str) -> list[dict[str, Any]]:
    return [
        {
            "data": base64.b64encode(os.urandom(4096)).decode(),
            "device": "node1:dram",
            "type": "input",
            "format": tag,
        }
        for _ in range(count)
    ]


def wait_small(tag: str, count: int, timeout: float) -> None:
    """Until every chunk tagged `tag` is available (one cheap count per poll, so the workers keep the CPU)."""
    from gswarm_web.extensions import db
    from gswarm_web.tables import DataChunk

    def done() -> bool:
        db.session.remove()
        rows = db.session.execute(
            db.select(DataChunk.status, db.func.count())
            .where(DataChunk.format == tag)
            .group_by(DataChunk.status)
        ).all()
        by = {str(s): int(n) for s, n in rows}
        if by.get("failed"):
            raise SystemExit(f"{by['failed']} small chunks failed")
        return by.get("available", 0) == count

    wait_for(done, timeout, f"{count} small chunks to be available", interval=0.05)


def small_row(case: str, count: int, submit_s: float, total_s: float) -> dict[str, Any]:
    return {
        "case": case,
        "count": count,
        "submit_s": round(submit_s, 3),
        "submit_chunks_per_s": round(count / submit_s, 1),
        "end_to_end_s": round(total_s, 3),
        "end_to_end_chunks_per_s": round(count / total_s, 1),
    }


def bench_small(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    n = args.small_count
    timeout = max(300.0, n / 5)
    # warm the path once (imports, connections, the worker's first task)
    for body in small_bodies(20, "bench-warm"):
        assert fleet.post("/data", body)[0] == 202
    wait_small("bench-warm", 20, 60)

    rows = []
    bodies = small_bodies(n, "bench-seq")
    t0 = time.perf_counter()
    for body in bodies:
        code, resp = fleet.post("/data", body)
        assert code == 202, resp
    submit = time.perf_counter() - t0
    wait_small("bench-seq", n, timeout)
    rows.append(small_row("sequential POSTs, Flask test client", n, submit, time.perf_counter() - t0))

    if args.small_threads > 0:
        import requests

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access line per request
        base = fleet.serve_http() + "/api/v1/data"
        headers = fleet.auth()
        local = threading.local()
        errors: list[str] = []

        def post(body: dict[str, Any]) -> None:
            s = getattr(local, "session", None)
            if s is None:
                s = local.session = requests.Session()
            r = s.post(base, json=body, headers=headers, timeout=60)
            if r.status_code != 202:
                errors.append(f"{r.status_code} {r.text[:200]}")

        bodies = small_bodies(n, "bench-http")
        with ThreadPoolExecutor(args.small_threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(post, bodies))
            submit = time.perf_counter() - t0
        if errors:
            raise SystemExit(f"{len(errors)} HTTP POSTs failed, first: {errors[0]}")
        wait_small("bench-http", n, timeout)
        rows.append(
            small_row(
                f"{args.small_threads} HTTP client threads (in-process werkzeug server)",
                n,
                submit,
                time.perf_counter() - t0,
            )
        )
    return {"chunk_bytes": 4096, "results": rows}


# ---- main ---------------------------------------------------------------------------------------------------


def selection(text: str) -> list[str]:
    if text == "all":
        return list(BENCHES)
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in BENCHES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(BENCHES)} or all (comma-separated)")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        type=selection,
        default=list(BENCHES),
        help="models, chunks, small, compression (comma-separated)",
    )
    ap.add_argument("--size-mib", type=int, default=1024, help="model size")
    ap.add_argument("--chunk-mib", type=int, default=1024, help="chunk size for the chunk transfer")
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument(
        "--streams", type=int, help="transfer.streams of the nodes (default: the setting's default)"
    )
    ap.add_argument("--small-count", type=int, default=10_000)
    ap.add_argument("--small-threads", type=int, default=4, help="HTTP client threads (0: sequential only)")
    ap.add_argument("--profile", help="directory for py-spy recordings of both node workers per transfer")
    ap.add_argument("--profile-format", default="flamegraph", choices=("flamegraph", "raw", "speedscope"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-transfer-"))
    src_root = tmp / "src"
    src_root.mkdir()
    env = {"GSWARM_MODELS_ALLOWED_ROOTS": str(src_root), "GSWARM_LOG_LEVEL": "WARNING"}
    if args.streams:
        env["GSWARM_TRANSFER_STREAMS"] = str(args.streams)
    fleet = Fleet(tmp, extra_env=env)
    summary: dict[str, Any] = {}
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        if "models" in args.only or "chunks" in args.only or "compression" in args.only:
            fleet.start_node("node2")
            PROFILES.out_dir, PROFILES.fmt, PROFILES.rate = args.profile, args.profile_format, 250
            PIDS.update(node1=fleet.procs["node1"].pid, node2=fleet.procs["node2"].pid)
        if "models" in args.only:
            summary["models"] = bench_models(fleet, src_root, args)
        if "chunks" in args.only:
            summary["chunks"] = bench_chunks(fleet, src_root, args)
        if "small" in args.only:
            summary["small"] = bench_small(fleet, args)
        if "compression" in args.only:
            summary["compression"] = bench_compression(fleet, src_root, args)
        print(json.dumps(summary, indent=2))
        for name in ("models", "chunks"):
            for r in summary.get(name, {}).get("results", []):
                print(
                    f"{'PASS' if r['pass'] else 'MISS'} {r['case']}: ratio {r['ratio']} (goal >= {r['goal']}),"
                    f" gswarm {r['gswarm_s']} s, baseline {r['baseline_s']} s (medians of {args.repeat})"
                )
            for r in summary.get(name, {}).get("limits", []):
                print(
                    f"INFO {r['case']} (sendfile, the physical limit): ratio {r['ratio']},"
                    f" gswarm {r['gswarm_s']} s, nginx {r['baseline_s']} s"
                )
        for r in summary.get("compression", {}).get("results", []):
            print(
                f"INFO {r['case']}: zstd {r['zstd_s']} s and {r['zstd_wire_bytes']} bytes on the wire, none"
                f" {r['none_s']} s and {r['none_wire_bytes']} bytes (wire x{r['wire_ratio']}, time x{r['time_ratio']})"
            )
        for r in summary.get("small", {}).get("results", []):
            print(
                f"INFO {r['count']} x 4 KiB chunks, {r['case']}: submit {r['submit_chunks_per_s']} chunks/s"
                f" ({r['submit_s']} s), all available {r['end_to_end_chunks_per_s']} chunks/s ({r['end_to_end_s']} s)"
            )
        return 0
    finally:
        fleet.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
