"""`gswarm model serve|scale|stop|services|service-health|scaling`: a model's services, over the API."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from .client import ApiClient
from .model import api, follow, full_device

console = Console(soft_wrap=True)


@click.command("serve")
@click.argument("name")
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="auto, auto:gpu, auto:cpu, gpuN or cpu (--node), NODE:gpuN.",
)
@click.option(
    "--replicas", type=click.IntRange(1, 64), default=None, help="1 by default (autoscaled: its minimum)."
)
@click.option("--node", default=None)
@click.option("--port", type=int, default=None)
@click.option(
    "--engine",
    default="builtin",
    show_default=True,
    help="A serving preset of the nodes (builtin, vllm, sglang, ...).",
)
@click.option(
    "--idle-timeout", type=float, default=None, help="Seconds without requests before it is unloaded."
)
@click.option(
    "--min-replicas", type=click.IntRange(0, 64), default=None, help="Autoscaled: the fewest (0: sleeps)."
)
@click.option("--max-replicas", type=click.IntRange(1, 64), default=None, help="Autoscaled: the most.")
@click.option(
    "--target-in-flight", type=float, default=None, help="Autoscaled: requests in flight per replica (4)."
)
@click.option(
    "--target-engine-waiting",
    type=float,
    default=None,
    help="Autoscaled: requests waiting in each replica's engine queue (vllm:num_requests_waiting, ...).",
)
@click.option(
    "--timeout", type=float, default=600, show_default=True, help="Seconds to wait for the replicas."
)
@click.option("--no-wait", is_flag=True)
def serve(
    name: str,
    device: str,
    replicas: int | None,
    node: str | None,
    port: int | None,
    engine: str,
    idle_timeout: float | None,
    min_replicas: int | None,
    max_replicas: int | None,
    target_in_flight: float | None,
    target_engine_waiting: float | None,
    timeout: float,
    no_wait: bool,
) -> None:
    """Serve a model (N replicas behind the gateway, or as many as the load asks for between --min-replicas and
    --max-replicas) and wait until they answer."""
    c = api()
    target = device if device.startswith("auto") else full_device(device, node, "--device")
    body: dict[str, Any] = {"model_name": name, "device": target, "engine": engine}
    given = {"min_replicas": min_replicas, "max_replicas": max_replicas, "target_in_flight": target_in_flight,
             "target_engine_waiting": target_engine_waiting}  # fmt: skip
    if any(v is not None for v in given.values()):
        body["autoscaling"] = {k: v for k, v in given.items() if v is not None}
    if replicas is not None or "autoscaling" not in body:
        body["replicas"] = replicas or 1
    if port:
        body["port"] = port
    if idle_timeout:
        body["idle_timeout_s"] = idle_timeout
    svc = c.post("services", body)
    for r in svc["instances"]:
        chosen = (r.get("placement") or {}).get("loaded_from")
        console.print(
            f"replica {r['id'][:8]} -> {r['device']}" + (f" (weights from {chosen})" if chosen else "")
        )
    if not no_wait and svc["replicas"] > 0:
        svc = wait_replicas(c, svc["id"], svc["replicas"], timeout)
    console.print(
        f"service {svc['id']} ({svc['ready_replicas']}/{svc['replicas']} ready, {svc['status']}): "
        f"{c.base_url}/v1 model={svc['gateway_model']}"
    )
    for r in svc["instances"]:
        if r.get("url"):
            console.print(f"  {r['device']}: {r['url']}", highlight=False)


def wait_replicas(c: ApiClient, service_id: str, count: int, timeout: float) -> dict[str, Any]:
    """Poll a service until `count` replicas run; exit 1 when it fails or the wait runs out."""
    deadline = time.monotonic() + timeout
    with console.status(f"waiting for {count} replica(s)") as status:
        while True:
            svc = c.get(f"services/{service_id}")
            status.update(f"{svc['ready_replicas']}/{count} replica(s) running ({svc['status']})")
            if svc["ready_replicas"] >= count and svc["status"] == "running":
                return svc
            if svc["status"] in ("failed", "stopped") or time.monotonic() > deadline:
                console.print(
                    f"[red]service {service_id} {svc['status']}[/]: {svc.get('status_message') or ''}"
                )
                sys.exit(1)
            time.sleep(0.5)


def live_service(c: ApiClient, name: str) -> dict[str, Any]:
    found = [
        s
        for s in c.get("services", per_page=500)["services"]
        if name in (s["id"], s["model_name"]) and s["status"] not in ("stopping", "stopped", "failed")
    ]
    if len(found) != 1:
        what = "no live service" if not found else f"{len(found)} live services (name one by id)"
        raise click.ClickException(f"{what} of {name}")
    return found[0]


@click.command("scale")
@click.argument("name_or_service")
@click.argument("replicas", type=click.IntRange(1, 64))
@click.option("--timeout", type=float, default=600, show_default=True)
@click.option("--no-wait", is_flag=True)
def scale(name_or_service: str, replicas: int, timeout: float, no_wait: bool) -> None:
    """Keep a model's service at REPLICAS replicas (placement chooses where new ones go)."""
    c = api()
    svc = c.request(
        "PATCH", f"services/{live_service(c, name_or_service)['id']}", json={"replicas": replicas}
    )
    if not no_wait:
        svc = wait_replicas(c, svc["id"], replicas, timeout)
    console.print(f"service {svc['id']}: {svc['ready_replicas']}/{svc['replicas']} replicas running")


@click.command("stop")
@click.argument("name_or_service")
@click.option("--device", default=None, help="Only the service on this device.")
@click.option("--node", default=None)
def stop(name_or_service: str, device: str | None, node: str | None) -> None:
    """Stop a model's services (or one service by id)."""
    c = api()
    dev = full_device(device, node, "--device")

    def on(s: dict[str, Any]) -> bool:
        """On the device asked for: a bare tier with no node known is that tier on any node."""
        if dev is None:
            return True
        return str(s["device"]).endswith(f":{device}") if dev.startswith("auto:") else s["device"] == dev

    running = [
        s
        for s in c.get("services", per_page=500)["services"]
        if s["status"] not in ("stopping", "stopped", "failed")  # pending, idle and degraded ones too
        and name_or_service in (s["id"], s["model_name"])
        and on(s)
    ]
    if not running:
        where = f" on {device}" if device else ""
        raise click.ClickException(f"no running service of {name_or_service}{where}")
    for s in running:
        follow(c, c.delete(f"services/{s['id']}"), f"stop {s['id'][:8]}")


@click.command("services")
@click.option("--json", "as_json", is_flag=True)
def services(as_json: bool) -> None:
    """List services."""
    body = api().get("services", per_page=500)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    table = Table("id", "model", "device", "status", "healthy", "url")
    for s in body["services"]:
        table.add_row(
            s["id"][:8], s["model_name"], s["device"], s["status"], str(s["healthy"]), s["url"] or "-"
        )
    console.print(table)


@click.command("service-health")
@click.argument("name_or_service")
@click.option("--json", "as_json", is_flag=True, help="Print each service's status as JSON.")
def service_health(name_or_service: str, as_json: bool) -> None:
    """Health of a model's services (or one service by id), replica by replica; exit 1 when one is not healthy."""
    c = api()
    found = [
        s
        for s in c.get("services", per_page=500)["services"]
        if name_or_service in (s["id"], s["model_name"]) and s["status"] not in ("stopped", "failed")
    ]
    if not found:
        raise click.ClickException(f"no live service of {name_or_service} (`gswarm model serve` starts one)")
    report = [{**c.get(f"services/{s['id']}/status"), "instances": s["instances"]} for s in found]
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        table = Table("service", "replica", "device", "status", "healthy", "last check", "url")
        for svc in report:
            for r in svc["instances"]:
                healthy = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[r.get("healthy")]
                table.add_row(svc["id"][:8], r["id"][:8], r["device"], r["status"], healthy,
                              (r.get("last_check_at") or "-")[:19], r.get("url") or "-")  # fmt: skip
        console.print(table)
        for svc in report:
            up = f"up {svc['uptime_s']:.0f} s" if svc.get("uptime_s") is not None else "not up"
            msg = f"  ({svc['message']})" if svc.get("message") else ""
            console.print(f"service {svc['id']}: {svc['status']}, {svc['ready_replicas']}/{svc['replicas']} ready, "
                          f"{up}{msg}", highlight=False)  # fmt: skip
    # an idle service is unloaded on purpose and wakes with its next request
    if not all(
        svc["status"] == "idle" or (svc.get("healthy") and svc["status"] == "running") for svc in report
    ):
        sys.exit(1)


def _policy_text(policy: dict[str, Any] | None) -> str:
    if not policy:
        return "fixed (no autoscaling)"
    if policy.get("target_in_flight") is not None:
        target = f"{policy['target_in_flight']:g} in flight per replica"
    elif policy.get("target_engine_waiting") is not None:
        target = f"{policy['target_engine_waiting']:g} waiting in each engine's queue"
    else:
        target = f"queue wait {policy['target_queue_wait_s']:g} s"
    return (
        f"{policy['min_replicas']} to {policy['max_replicas']} replicas, target {target}, up after "
        f"{policy['scale_up_delay_s']:g} s, down after {policy['scale_down_delay_s']:g} s"
    )


@click.command("scaling")
@click.argument("name_or_service")
@click.option("--limit", type=click.IntRange(1, 50), default=20, show_default=True, help="Decisions shown.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (GET /services/{id}/scaling).")
def scaling(name_or_service: str, limit: int, as_json: bool) -> None:
    """A service's autoscaling: its policy, the load the autoscaler sees and its decisions, newest first."""
    c = api()
    svc = live_service(c, name_or_service)
    body = c.get(f"services/{svc['id']}/scaling")
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    in_flight = sum(body["in_flight"].values())
    counts = f"{body['ready_replicas']} ready, {body['draining_replicas']} draining"
    console.print(f"service {body['service_id']} ({svc['model_name']}): {body['replicas']} replicas ({counts})",
                  highlight=False)  # fmt: skip
    console.print(f"autoscaling: {_policy_text(body['autoscaling'])}", highlight=False)
    engine = body.get("engine_waiting")
    queued = f", {engine:g} waiting in the engines' queues" if engine is not None else ""
    console.print(f"load now: {in_flight} in flight, {body['waiting']} waiting{queued}", highlight=False)
    table = Table("at", "replicas", "why", "load seen")
    for e in body["events"][:limit]:
        style = "green" if e["direction"] == "up" else "yellow"
        seen = ", ".join(f"{k} {v}" for k, v in (e.get("load") or {}).items()) or "-"
        table.add_row(
            e["at"][:19], f"[{style}]{e['from_replicas']} -> {e['to_replicas']}[/]", e["reason"], seen
        )
    if body["events"]:
        console.print(table)
    else:
        console.print("no scaling decision yet")


COMMANDS = (serve, scale, stop, services, service_health, scaling)
