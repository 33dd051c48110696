"""Engine benchmark: the OpenAI-compatible gateway against calling the replica directly, on real engines (vLLM's CPU
build, llama.cpp's llama-server), with NVIDIA's aiperf as the load client, in one run on a real fleet (node1 with the
engines scripts/engines.sh installs, the API under gunicorn as `gswarm up` runs it, a Redis of its own).

1. vLLM embeddings (MiniLM, `engine: vllm` on node1:cpu) and llama.cpp chat (SmolLM2 as GGUF from a Hugging Face
   endpoint, `engine: llama.cpp`), at each `--concurrency` level (1, 4, 16): an aiperf run through the gateway and one
   straight to the replica (with its service key), the order swapped at each level and round so drift falls on
   both alike. Judged: p50 request latency gateway / direct (goal <= 1.03) and requests/s gateway / direct (goal
   >= 0.97); every request of these runs must succeed.
2. The time from `POST /services` to the first successful answer through the gateway, for each engine (and for
   the autoscaled service of 3).
3. A 4x load step on an autoscaled vLLM service (`device: auto:cpu`, min 1, max 2 replicas, `--target-in-flight`):
   one aiperf run, concurrency 1 for `--step-base` s (its warmup phase), then concurrency 4 for `--step-seconds` s
   (its profiling phase; the phases follow each other at once). Judged: failed requests of both phases (goal 0);
   reported: the replicas reached, when the scale-up was decided and when the added replica was ready, counted from
   the step, and the step's latencies.

aiperf runs from its own environment (`--aiperf`, by default $GSWARM_ENGINES_DIR/aiperf/bin/aiperf; aiperf 0.13),
with the local MiniLM tokenizer for its synthetic prompts (nothing is fetched), and leaves in its artifact
directory what is read here: profile_export_aiperf.json (the profiling phase's metrics; absent when every request
failed), profile_export.jsonl (every request of every phase, with its error if it failed) and phase_manifest.json
(the phases' start and end, when there is a warmup phase).

Usage: `.venv/bin/python bench/engines.py [--only vllm,llamacpp,step] [--concurrency 1,4,16] [--duration 5]
[--requests N] [--repeat 1] [--artifacts DIR]` (about 12 minutes with the defaults on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.autoscale import own_redis  # noqa: E402
from bench.common import Profiles, Row  # noqa: E402
from bench.gateway import service, start_api  # noqa: E402
from gswarm_tasks.serving.keys import key_for  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.hfserver import HfTestServer  # noqa: E402
from tests.harness.procs import process_tree, wait_for  # noqa: E402

ENGINES = Path(os.environ.get("GSWARM_ENGINES_DIR", Path.home() / ".cache" / "gswarm" / "engines"))
MINILM = ENGINES / "models" / "all-MiniLM-L6-v2"
GGUF = ENGINES / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
START_S = 420  # a vLLM start on two busy cores (torch.compile included) takes one to three minutes
EMBED, CHAT, SCALED = "minilm", "smollm2", "minilm-auto"


@dataclass(frozen=True)
class Case:
    """One engine of the comparison: its model, the service it asks for, aiperf's endpoint type and the first
    request sent through the gateway once the service is asked for."""

    key: str
    title: str
    model: str
    body: dict[str, Any]
    endpoint: str
    probe: dict[str, Any]


CASES = {
    "vllm": Case(
        "vllm",
        "vLLM embeddings",
        EMBED,
        {"model_name": EMBED, "device": "node1:cpu", "engine": "vllm"},
        "embeddings",
        {"path": "/v1/embeddings", "json": {"model": EMBED, "input": ["a first request"]}},
    ),
    "llamacpp": Case(
        "llamacpp",
        "llama.cpp chat",
        CHAT,
        {"model_name": CHAT, "device": "node1:cpu", "engine": "llama.cpp"},
        "chat",
        {
            "path": "/v1/chat/completions",
            "json": {
                "model": CHAT,
                "messages": [{"role": "user", "content": "Name a colour."}],
                "max_tokens": 4,
            },
        },
    ),
}


# --- aiperf ---


class Aiperf:
    """aiperf runs against one URL each, every run in its own artifact directory."""

    def __init__(self, program: str, out_dir: Path, args: argparse.Namespace) -> None:
        self.program = program
        self.out_dir = out_dir
        self.args = args
        self.runs = 0

    def argv(self, url: str, key: str, model: str, endpoint: str, concurrency: int, out: Path) -> list[str]:
        a = self.args
        argv = [
            self.program, "profile", "--model", model, "--url", url, "--endpoint-type", endpoint, "--api-key", key,
            "--tokenizer", str(MINILM), "--isl", str(a.isl), "--isl-stddev", "0", "--random-seed", "7",
            "--concurrency", str(concurrency), "--request-timeout-seconds", "120",
            "--artifact-dir", str(out), "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
        ]  # fmt: skip
        if (
            endpoint == "chat"
        ):  # a fixed answer length: max_tokens (llama.cpp's name) and no early end of sequence
            argv += ["--osl", str(a.osl), "--use-legacy-max-tokens", "--extra-inputs", "ignore_eos:true"]
        return argv

    def run(self, argv: list[str], out: Path, timeout: float) -> dict[str, Any]:
        """Run aiperf (in a process group of its own: it starts several processes) and read its results."""
        out.mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GSWARM_", "HF_HUB_OFFLINE", "HF_ENDPOINT"))
        }
        env["HF_HUB_DISABLE_TELEMETRY"] = (
            "1"  # a local tokenizer path; HF_HUB_OFFLINE=1 would make aiperf refuse it
        )
        with open(out / "aiperf.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)  # fmt: skip
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                rc = 124  # what it measured is lost; the run counts as unfinished
            finally:
                stop_group(proc)
        self.runs += 1
        return read_results(out, rc)

    def compare(
        self, url: str, key: str, model: str, endpoint: str, concurrency: int, tag: str
    ) -> dict[str, Any]:
        a = self.args
        out = self.out_dir / tag
        argv = self.argv(url, key, model, endpoint, concurrency, out)
        argv += ["--warmup-request-count", str(max(4, concurrency))]
        if a.requests:
            argv += ["--request-count", str(max(a.requests, concurrency))]
        else:
            argv += ["--benchmark-duration", str(a.duration), "--benchmark-grace-period", "60"]
        return self.run(argv, out, timeout=300 + (a.duration or 0))

    def step(self, url: str, key: str, model: str, tag: str) -> dict[str, Any]:
        a = self.args
        out = self.out_dir / tag
        argv = self.argv(url, key, model, "embeddings", 4, out)
        argv += ["--warmup-concurrency", "1", "--warmup-duration", str(a.step_base),
                 "--benchmark-duration", str(a.step_seconds), "--benchmark-grace-period", "120"]  # fmt: skip
        return self.run(argv, out, timeout=400 + a.step_base + a.step_seconds)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process started in its own session and everything it started."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):
            break
        time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def read_results(out: Path, rc: int) -> dict[str, Any]:
    """What one aiperf run measured: its profiling phase's p50/p99 latency (ms) and requests/s (successful requests
    over the phase's duration) from profile_export_aiperf.json, and the requests of each phase that failed, with
    the kinds of error, from profile_export.jsonl (the JSON export is missing when every request failed)."""
    res: dict[str, Any] = {"rc": rc, "dir": str(out)}
    export = out / "profile_export_aiperf.json"
    if export.exists():
        doc = json.loads(export.read_text())
        lat = doc.get("request_latency") or {}
        res.update(
            p50_ms=lat.get("p50"),
            p99_ms=lat.get("p99"),
            rps=(doc.get("request_throughput") or {}).get("avg"),
            ok=int((doc.get("request_count") or {}).get("avg") or 0),
            duration_s=(doc.get("benchmark_duration") or {}).get("avg"),
        )
    else:
        res.update(p50_ms=None, p99_ms=None, rps=0.0, ok=0, duration_s=None)
    phases: dict[str, dict[str, int]] = {}
    errors: dict[str, int] = {}
    records = out / "profile_export.jsonl"
    if records.exists():
        for line in records.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            phase = (rec.get("metadata") or {}).get("benchmark_phase") or "?"
            counts = phases.setdefault(phase, {"requests": 0, "failed": 0})
            counts["requests"] += 1
            err = rec.get("error")
            if err:
                counts["failed"] += 1
                kind = f"{err.get('code')} {err.get('type')}: {str(err.get('message'))[:120]}"
                errors[kind] = errors.get(kind, 0) + 1
    res["phases"] = phases
    res["failed"] = sum(p["failed"] for p in phases.values())
    res["errors"] = errors
    manifest = out / "phase_manifest.json"
    if manifest.exists():
        res["phase_times"] = {p["phase_name"]: (p["start_ns"] / 1e9, p["end_ns"] / 1e9)
                              for p in json.loads(manifest.read_text()).get("phases", [])}  # fmt: skip
    if rc != 0 or not phases:
        log = (out / "aiperf.log").read_text(errors="replace") if (out / "aiperf.log").exists() else ""
        res["log_tail"] = log[-1500:]
    return res


# --- where the gateway's time goes ---


def schedstat(procs: list[psutil.Process]) -> tuple[float, float]:
    """Seconds on a core and seconds runnable but waiting for one, over every thread of `procs`
    (/proc/<pid>/task/<tid>/schedstat: the kernel's run time and run-queue delay, in ns)."""
    run = wait = 0
    for p in procs:
        for task in Path(f"/proc/{p.pid}/task").glob("*"):
            try:
                fields = (task / "schedstat").read_text().split()
            except OSError:
                continue  # a thread that ended meanwhile
            run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


class Clock:
    """CPU time and run-queue wait of the gateway's and the engine's processes over one aiperf run."""

    def __init__(self, api_pid: int, engine_pid: int | None) -> None:
        self.groups = {
            "gateway": process_tree(api_pid),
            "engine": process_tree(engine_pid) if engine_pid else [],
        }
        self.start = {k: schedstat(v) for k, v in self.groups.items()}

    def per_request(self, requests_done: int) -> dict[str, float]:
        out = {}
        for k, procs in self.groups.items():
            (r0, w0), (r1, w1) = self.start[k], schedstat(procs)
            n = max(1, requests_done)
            out[f"{k}_cpu_ms"] = round((r1 - r0) * 1000 / n, 2)
            out[f"{k}_runq_ms"] = round((w1 - w0) * 1000 / n, 2)
        return out


# --- the fleet ---


def start_fleet(fleet: Fleet, engine_cpus: str | None = None) -> str:
    """The control worker, node1 with vLLM and llama.cpp in their own directories, beat and the API; its URL.
    `engine_cpus`: the cores vLLM's compute threads are bound to (its VLLM_CPU_OMP_THREADS_BIND)."""
    paths = json.dumps({"vllm": str(ENGINES / "vllm"), "llama.cpp": str(ENGINES / "llama.cpp")})
    fleet.start("control", "control", app_module="gswarm_web.celery_app")
    bind = {"VLLM_CPU_OMP_THREADS_BIND": engine_cpus} if engine_cpus else {}
    fleet.start_node("node1", GSWARM_SERVE_ENGINE_PATHS=paths, **bind)
    fleet.start_beat()
    api = start_api(fleet)
    wait_for(lambda: (fleet.get("/nodes/node1")[1].get("engines") or {}).get("vllm"), 120, "node1's engines")
    return api


def register(fleet: Fleet, only: set[str]) -> None:
    names = ([EMBED] if "vllm" in only else []) + ([SCALED] if "step" in only else [])
    for name in names:
        fleet.register_and_download(name, f"file://{MINILM}", device="node1:disk")
    if "llamacpp" in only:
        code, body = fleet.post(
            "/models", {"model_name": CHAT, "model_type": "llm", "source_url": f"hf://{GGUF_REPO}"}
        )
        assert code == 201, body
        code, body = fleet.post(f"/models/{CHAT}/download", {"target_device": "node1:disk"})
        assert code == 202 and fleet.wait_task(body["task_id"], 300)["status"] == "succeeded", body


def serve_until_answered(fleet: Fleet, gateway: str, body: dict[str, Any], probe: dict) -> tuple[str, float]:
    """POST /services, then the probe through the gateway until it answers 200: the service and the seconds."""
    t0 = time.monotonic()
    code, answer = fleet.post("/services", body)
    assert code == 202, answer
    sid = answer["id"]
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {fleet.token}"
    last = ""
    while time.monotonic() - t0 < START_S + 60:
        try:
            r = session.post(f"{gateway}{probe['path']}", json=probe["json"], timeout=60)
            if r.status_code == 200:
                return sid, time.monotonic() - t0
            last = f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as exc:
            last = repr(exc)
        status = service(fleet, sid)["status"]
        assert status != "failed", f"the service failed: {service(fleet, sid)}"
        time.sleep(0.2)
    raise AssertionError(f"no answer through the gateway from {body} after {START_S + 60} s (last: {last})")


def replica(fleet: Fleet, sid: str) -> tuple[str, str]:
    """The running replica's URL and its service key (the node keeps it in Redis by URL)."""

    def up() -> dict[str, Any] | None:
        s = service(fleet, sid)
        return s if s["status"] == "running" else None

    svc = wait_for(up, 120, "the service running")
    url = next(i["url"] for i in svc["instances"] if i["status"] == "running")
    key = key_for(redis.Redis.from_url(fleet.redis_url), url)
    assert key, f"no key recorded for {url}"
    return url, key


def stop(fleet: Fleet, sid: str) -> None:
    """Stop a service and wait until nothing of its engines runs (the next case gets the cores and memory)."""
    procs = []
    for inst in service(fleet, sid)["instances"]:
        if inst.get("pid"):
            try:
                root = psutil.Process(inst["pid"])
                procs += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
    code, _ = fleet.api("DELETE", f"/services/{sid}")
    assert code == 202
    wait_for(lambda: service(fleet, sid)["status"] == "stopped", 120, "the stop")
    wait_for(lambda: not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 60,
             "nothing of the engine running")  # fmt: skip


# --- the cases ---


def compare(fleet: Fleet, gateway: str, ap: Aiperf, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    sid, first_s = serve_until_answered(fleet, gateway, case.body, case.probe)
    try:
        url, key = replica(fleet, sid)
        running = [i for i in service(fleet, sid)["instances"] if i["status"] == "running"]
        engine, engine_pid = running[0]["engine"], running[0].get("pid")
        print(f"{case.title}: {engine} at {url}, first answer through the gateway {first_s:.1f} s after the POST",
              flush=True)  # fmt: skip
        levels: dict[str, Any] = {}
        for li, c in enumerate(args.concurrency):
            rounds = []
            for r in range(args.repeat):
                order = ("gateway", "direct") if (li + r) % 2 == 0 else ("direct", "gateway")
                got: dict[str, Any] = {}
                for path in order:
                    target, bearer = (gateway, fleet.token) if path == "gateway" else (url, key)
                    tag = f"{case.key}-c{c}-r{r}-{path}"
                    clock = Clock(fleet.procs["api"].pid, engine_pid)
                    spied = {"api": fleet.procs["api"].pid} if path == "gateway" else {}
                    with Profiles(args.profile, "raw").record(tag, spied):
                        got[path] = ap.compare(target, bearer, case.model, case.endpoint, c, tag)
                    sent = sum(ph["requests"] for ph in got[path]["phases"].values())
                    got[path]["time"] = clock.per_request(sent)
                gw, dr = got["gateway"], got["direct"]
                one = {
                    "order": list(order),
                    "gateway": brief(gw),
                    "direct": brief(dr),
                    "p50_ratio": ratio(gw["p50_ms"], dr["p50_ms"]),
                    "rps_ratio": ratio(gw["rps"], dr["rps"]),
                }
                rounds.append(one)
                print(f"  concurrency {c} round {r + 1}: {json.dumps(one)}", flush=True)
            levels[str(c)] = rounds
        return {"engine": engine, "first_answer_s": round(first_s, 2), "levels": levels}
    finally:
        stop(fleet, sid)


def brief(res: dict[str, Any]) -> dict[str, Any]:
    out = {
        k: (round(res[k], 2) if isinstance(res[k], float) else res[k])
        for k in ("p50_ms", "p99_ms", "rps", "ok")
    }
    out["failed"] = res["failed"]
    # CPU and run-queue wait per request (every phase's), of the gateway's and the engine's processes
    out.update(res.get("time") or {})
    if res["rc"] != 0:
        out["rc"] = res["rc"]
    if res["errors"]:
        out["errors"] = res["errors"]
    if res.get("log_tail"):
        out["log_tail"] = res["log_tail"]
    return out


def ratio(a: float | None, b: float | None) -> float:
    return round(a / b, 4) if a is not None and b else float("nan")


def load_step(fleet: Fleet, gateway: str, ap: Aiperf, args: argparse.Namespace) -> dict[str, Any]:
    policy = {"min_replicas": 1, "max_replicas": 2, "target_in_flight": args.target_in_flight,
              "scale_up_delay_s": 1, "scale_down_delay_s": 30}  # fmt: skip
    body = {"model_name": SCALED, "device": "auto:cpu", "engine": "vllm", "autoscaling": policy}
    probe = {"path": "/v1/embeddings", "json": {"model": SCALED, "input": ["a first request"]}}
    sid, first_s = serve_until_answered(fleet, gateway, body, probe)
    try:
        first = {i["id"] for i in service(fleet, sid)["instances"] if i["status"] == "running"}
        print(f"autoscaled vLLM: first answer through the gateway {first_s:.1f} s after the POST", flush=True)
        ready: dict[str, float] = {}  # replica id -> when the API first showed it running
        most = [len(first)]
        done = threading.Event()

        def watch() -> None:  # over the API's HTTP (the fleet's test client belongs to this thread)
            s = requests.Session()
            s.headers["Authorization"] = f"Bearer {fleet.token}"
            while not done.is_set():
                try:
                    doc = s.get(f"{gateway}/api/v1/services/{sid}", timeout=10).json()
                    now = time.time()
                    running = [i["id"] for i in doc["instances"] if i["status"] == "running"]
                    most[0] = max(most[0], len(running))
                    for rid in running:
                        if rid not in first:
                            ready.setdefault(rid, now)
                except (requests.RequestException, ValueError, KeyError):
                    pass
                done.wait(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            res = ap.step(gateway, fleet.token, SCALED, "step")
        finally:
            done.set()
            watcher.join(15)
        times = res.get("phase_times") or {}
        stepped = times.get("profiling", (None, None))[0]
        since = times.get("warmup", (stepped, None))[0] or 0.0
        events = [e for e in fleet.get(f"/services/{sid}/scaling")[1]["events"]
                  if datetime.fromisoformat(e["at"]).timestamp() >= since]  # fmt: skip
        ups = sorted(datetime.fromisoformat(e["at"]).timestamp() for e in events if e["direction"] == "up")
        out = {
            "first_answer_s": round(first_s, 2),
            "policy": policy,
            "failed": res["failed"],
            "phases": res["phases"],
            "errors": res["errors"],
            "step_p50_ms": res["p50_ms"] and round(res["p50_ms"], 2),
            "step_p99_ms": res["p99_ms"] and round(res["p99_ms"], 2),
            "step_rps": res["rps"] and round(res["rps"], 2),
            "replicas_reached": most[0],
            "scale_up_decided_s": round(ups[0] - stepped, 2) if ups and stepped else None,
            "added_replica_ready_s": round(min(ready.values()) - stepped, 2) if ready and stepped else None,
            "scaling_events": [
                {k: e.get(k) for k in ("at", "direction", "from_replicas", "to_replicas")} for e in events
            ],
        }
        if res.get("log_tail"):
            out["log_tail"] = res["log_tail"]
        return out
    finally:
        stop(fleet, sid)


# --- main ---


def rows(summary: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for key in ("vllm", "llamacpp"):
        if key not in summary or "error" in summary[key]:
            continue
        case, doc = CASES[key], summary[key]
        for c, rounds in doc["levels"].items():
            p50 = [r["p50_ratio"] for r in rounds]
            rps = [r["rps_ratio"] for r in rounds]
            out.append(Row(f"{case.title} p50 gateway / direct, concurrency {c}", p50, "x", "<= 1.03",
                           lambda m: m <= 1.03))  # fmt: skip
            out.append(Row(f"{case.title} requests/s gateway / direct, concurrency {c}", rps, "x", ">= 0.97",
                           lambda m: m >= 0.97))  # fmt: skip
        runs = [
            r[path] for rounds in doc["levels"].values() for r in rounds for path in ("gateway", "direct")
        ]
        failed = sum(run["failed"] for run in runs)
        out.append(Row(f"{case.title} failed requests (every run, both paths)", [failed], "requests", "= 0",
                       lambda m: m == 0))  # fmt: skip
        unfinished = sum(1 for run in runs if run.get("rc"))
        if unfinished:
            out.append(Row(f"{case.title} aiperf runs that did not finish", [unfinished], "runs", "= 0",
                           lambda m: m == 0))  # fmt: skip
    for key in ("vllm", "llamacpp"):
        if key in summary and "error" not in summary[key]:
            out.append(Row(f"{CASES[key].title}: POST /services to the first answer through the gateway",
                           [summary[key]["first_answer_s"]], "s", "info", None))  # fmt: skip
    if "step" in summary and "error" not in summary["step"]:
        st = summary["step"]
        out.append(Row("autoscaled vLLM: POST /services to the first answer through the gateway",
                       [st["first_answer_s"]], "s", "info", None))  # fmt: skip
        out.append(Row("autoscaled vLLM 4x step (concurrency 1 -> 4): failed requests", [st["failed"]], "requests",
                       "= 0", lambda m: m == 0))  # fmt: skip
        out.append(Row("autoscaled vLLM 4x step: replicas reached", [st["replicas_reached"]], "replicas", "info",
                       None))  # fmt: skip
        for name, k in (("step to the scale-up decision", "scale_up_decided_s"),
                        ("step to the added replica ready", "added_replica_ready_s")):  # fmt: skip
            if st[k] is not None:
                out.append(Row(f"autoscaled vLLM 4x step: {name}", [st[k]], "s", "info", None))
        if st["step_p50_ms"] is not None:
            out.append(
                Row("autoscaled vLLM 4x step: p50 during the step", [st["step_p50_ms"]], "ms", "info", None)
            )
            out.append(
                Row("autoscaled vLLM 4x step: p99 during the step", [st["step_p99_ms"]], "ms", "info", None)
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="vllm,llamacpp,step", help="some of vllm, llamacpp, step")
    ap.add_argument("--concurrency", default="1,4,16", help="the levels of the gateway/direct comparison")
    ap.add_argument("--duration", "--durations", type=float, default=5.0, help="seconds of each aiperf run")
    ap.add_argument(
        "--requests", type=int, default=0, help="a number of requests per aiperf run instead of seconds"
    )
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the comparison (the median is judged)")
    ap.add_argument(
        "--isl", type=int, default=16, help="input tokens of each request (the MiniLM tokenizer's)"
    )
    ap.add_argument("--osl", type=int, default=8, help="output tokens of each chat answer")
    ap.add_argument("--step-base", type=float, default=10.0, help="seconds at concurrency 1 before the step")
    ap.add_argument("--step-seconds", type=float, default=90.0, help="seconds at concurrency 4")
    ap.add_argument("--target-in-flight", type=float, default=2.0, help="the autoscaled service's target")
    ap.add_argument("--aiperf", default=str(ENGINES / "aiperf" / "bin" / "aiperf"))
    ap.add_argument("--artifacts", default=None, help="keep aiperf's artifact directories here")
    ap.add_argument(
        "--engine-cpus",
        default=None,
        help="bind vLLM's compute threads to these cores (e.g. 1), "
        "leaving the others to the gateway and the load client, as on a host whose engine has its own",
    )
    ap.add_argument("--profile", default=None, help="py-spy recordings (collapsed stacks) of the API's processes "
                    "during each gateway run, in this directory")  # fmt: skip
    args = ap.parse_args()
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - {"vllm", "llamacpp", "step"}
    if unknown:
        ap.error(f"--only: unknown {', '.join(sorted(unknown))} (vllm, llamacpp, step)")
    need = [Path(args.aiperf), ENGINES / "vllm" / "bin" / "python", ENGINES / "llama.cpp" / "bin" / "llama-server",
            GGUF, MINILM]  # fmt: skip
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        print(f"missing: {', '.join(missing)} (scripts/engines.sh installs the engines and models; aiperf goes in "
              f"its own environment: python3.11 -m venv {ENGINES / 'aiperf'} && {ENGINES / 'aiperf'}/bin/pip install "
              "aiperf)", file=sys.stderr)  # fmt: skip
        return 2

    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-engines-"))
    out_dir = Path(args.artifacts).resolve() if args.artifacts else tmp / "aiperf"
    aiperf = Aiperf(args.aiperf, out_dir, args)
    repo = tmp / "gguf-repo"
    repo.mkdir()
    shutil.copy(GGUF, repo / GGUF.name)
    kept = ("concurrency", "duration", "requests", "repeat", "isl", "osl", "step_base", "step_seconds",
            "target_in_flight", "engine_cpus")  # fmt: skip
    summary: dict[str, Any] = {"settings": {k: getattr(args, k) for k in kept}}
    with HfTestServer({GGUF_REPO: repo}) as hf, own_redis() as redis_url:
        env = {
            "GSWARM_MODELS_ALLOWED_ROOTS": str(MINILM.parent),
            "HF_ENDPOINT": hf.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "GSWARM_SERVE_READY_TIMEOUT": str(START_S),
            "GSWARM_QUEUE_TASK_TIMEOUT": "900",
            "GSWARM_HEARTBEAT_TIMEOUT": "10",
            "GSWARM_SERVE_AUTOSCALE_INTERVAL": "0.25",
            "GSWARM_LOG_LEVEL": "WARNING",
        }
        fleet = Fleet(tmp, extra_env=env, redis_url=redis_url)
        try:
            gateway = start_fleet(fleet, args.engine_cpus)
            register(fleet, only)
            for key in ("vllm", "llamacpp", "step"):
                if key not in only:
                    continue
                try:  # a case that fails leaves the others to run
                    if key == "step":
                        summary[key] = load_step(fleet, gateway, aiperf, args)
                    else:
                        summary[key] = compare(fleet, gateway, aiperf, CASES[key], args)
                except Exception as exc:
                    summary[key] = {"error": f"{type(exc).__name__}: {exc}"[:3000]}
                    print(f"{key}: {summary[key]['error']}", flush=True)
        finally:
            fleet.close()
            shutil.rmtree(tmp, ignore_errors=True)
    summary["aiperf_runs"] = aiperf.runs
    if args.artifacts:
        summary["artifacts"] = str(out_dir)
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary, indent=2), flush=True)
    for row in rows(summary):
        print(row.line(), flush=True)
    failed = [key for key in ("vllm", "llamacpp", "step") if "error" in summary.get(key, {})]
    for key in failed:
        title = CASES[key].title if key in CASES else "autoscaled vLLM 4x step"
        print(f"MISS {title}: the case did not finish: {summary[key]['error'][:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
