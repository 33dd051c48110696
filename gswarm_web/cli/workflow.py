"""`gswarm workflow ...` and `gswarm queue ...`."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gswarm_tasks.settings import load_settings

from .client import ApiClient

console = Console(soft_wrap=True)
STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "running": "cyan",
    "queued": "blue",
    "pending": "white",
    "skipped": "yellow",
    "cancelled": "magenta",
}


def api() -> ApiClient:
    return ApiClient.from_settings(load_settings())


def steps_table(wf: dict[str, Any]) -> Table:
    table = Table(title=f"{wf['name']} [{wf['status']}]  {wf['id']}")
    for col in ("step", "type", "status", "node", "device", "tries", "time", "detail"):
        table.add_column(col)
    for s in wf.get("steps", []):
        took = "-"
        if s.get("started_at") and s.get("finished_at"):
            span = datetime.fromisoformat(s["finished_at"]) - datetime.fromisoformat(s["started_at"])
            took = f"{span.total_seconds():.1f}s"
        detail = (s.get("error") or {}).get("message") or ", ".join(
            f"{k}={v}" for k, v in (s.get("outputs") or {}).items() if k != "output"
        )[:60]
        style = STATUS_STYLE.get(s["status"], "")
        table.add_row(
            s["action_id"],
            s["action_type"],
            f"[{style}]{s['status']}[/]",
            s.get("node") or "-",
            s.get("device") or "-",
            str(s.get("attempts") or 0),
            took,
            str(detail)[:70],
        )
    return table


@click.group("workflow")
def workflow() -> None:
    """Workflows: YAML DAGs of model and data actions."""


@workflow.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--wait", is_flag=True, help="Follow it live; the exit code says whether it succeeded.")
def run(file: str, wait: bool) -> None:
    """Submit a workflow file (YAML or JSON)."""
    c = api()
    body = c.request(
        "POST", "workflows", data=Path(file).read_bytes(), headers={"Content-Type": "application/yaml"}
    )
    console.print(f"workflow {body['id']} submitted ({sum(body['step_counts'].values())} steps)")
    if not wait:
        return
    with Live(console=console, refresh_per_second=4) as live:
        while True:
            wf = c.get(f"workflows/{body['id']}")
            live.update(steps_table(wf))
            if wf["status"] != "running":
                break
            time.sleep(0.5)
    style = STATUS_STYLE.get(wf["status"], "")
    console.print(f"[{style}]workflow {wf['status']}[/]")
    sys.exit(0 if wf["status"] == "succeeded" else 1)


@workflow.command("list")
@click.option(
    "--status",
    type=click.Choice(
        ["running", "succeeded", "failed", "cancelled", "completed", "canceled"], case_sensitive=False
    ),
    default=None,
    help="A workflow's state (the original's completed = succeeded).",
)
def list_workflows(status: str | None) -> None:
    """List workflows, newest first."""
    word = {"completed": "succeeded", "canceled": "cancelled"}.get((status or "").lower(), status)
    body = api().get("workflows", status=word.lower() if word else None, per_page=100)
    table = Table("id", "name", "status", "steps", "created")
    for w in body["workflows"]:
        counts = ", ".join(f"{k} {v}" for k, v in w["step_counts"].items())
        table.add_row(w["id"], w["name"], w["status"], counts, w["created_at"][:19])
    console.print(table)


@workflow.command("status")
@click.argument("workflow_id")
@click.option("--verbose", "-v", is_flag=True, help="Each step's outputs and error in full.")
@click.option("--json", "as_json", is_flag=True)
def status(workflow_id: str, verbose: bool, as_json: bool) -> None:
    """Every step of a workflow."""
    wf = api().get(f"workflows/{workflow_id}")
    if as_json:
        click.echo(json.dumps(wf, indent=2))
        return
    console.print(steps_table(wf))
    if verbose:
        for s in wf.get("steps", []):
            console.print(f"[bold]{s['action_id']}[/] ({s['action_type']}, {s['status']})")
            for key in ("node", "device", "started_at", "finished_at", "outputs", "error"):
                if s.get(key) not in (None, {}, ""):
                    value = s[key] if isinstance(s[key], str) else json.dumps(s[key])
                    console.print(f"  {key:<11} {value}", highlight=False)


@workflow.command("cancel")
@click.argument("workflow_id")
def cancel(workflow_id: str) -> None:
    """Cancel a running workflow."""
    wf = api().post(f"workflows/{workflow_id}/cancel", {})
    console.print(f"workflow {wf['id']} {wf['status']}")


@workflow.command("example")
@click.option(
    "--output", "output", required=True, type=click.Path(file_okay=False), help="Directory to write to."
)
@click.option(
    "--original", is_flag=True, help="Write them as the original docs have them (naming node1, node2)."
)
def example(output: str, original: bool) -> None:
    """Write the example workflows of the original gswarm docs, with `auto` devices: they run on any fleet that
    has the hardware they need (placement chooses every device at submission)."""
    from gswarm_web.workflows.examples import EXAMPLES, RUNNABLE

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (EXAMPLES if original else RUNNABLE).items():
        (out / f"{name}.yaml").write_text(text)
        console.print(f"wrote {out / f'{name}.yaml'}")


@click.group("queue")
def queue() -> None:
    """The task queue of the fleet."""


@queue.command("status")
def queue_status() -> None:
    """Pending, running and completed tasks per node and priority."""
    body = api().get("queue")
    table = Table("node", "priority", "pending", "running", "completed", "failed")
    for node, prios in sorted(body["nodes"].items()):
        for prio, c in prios.items():
            table.add_row(
                node, prio, str(c["pending"]), str(c["running"]), str(c["completed"]), str(c["failed"])
            )
    console.print(table)
    console.print("totals: " + ", ".join(f"{k} {v}" for k, v in body["totals"].items()))


def tasks_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table("task", "kind", "status", "node", "model/step", "created", "error")
    for t in tasks:
        table.add_row(
            t["task_id"],
            t["kind"],
            t["status"],
            t.get("node") or "-",
            t.get("model_name") or "-",
            t["created_at"][:19],
            ((t.get("error") or {}).get("message") or "")[:50],
        )
    return table


# gswarm's task states, and the original's words for them (`completed` is `succeeded`, `pending` is not started yet:
# `pending` or `queued`; the API takes both); `canceled` as the US spelling
TASK_STATES = ("pending", "queued", "running", "succeeded", "failed", "cancelled", "skipped")
STATUS_WORDS = {"completed": "completed", "canceled": "cancelled"}


def status_word(value: str | None) -> str | None:
    return None if value is None else STATUS_WORDS.get(value.lower(), value.lower())


@queue.command("tasks")
@click.option(
    "--status",
    type=click.Choice([*TASK_STATES, *STATUS_WORDS], case_sensitive=False),
    default=None,
    help="A task state; the original's completed (= succeeded) and pending (pending or queued) too.",
)
@click.option("--node", default=None)
def queue_tasks(status: str | None, node: str | None) -> None:
    """Tasks, newest first."""
    console.print(
        tasks_table(api().get("queue/tasks", status=status_word(status), node=node, per_page=100)["tasks"])
    )


@queue.command("cancel")
@click.argument("task_id")
def queue_cancel(task_id: str) -> None:
    """Cancel a pending or running task."""
    t = api().post(f"queue/tasks/{task_id}/cancel", {})
    console.print(f"task {t['task_id']} {t['status']}")


@queue.command("history")
@click.option("--limit", default=20, show_default=True)
@click.option(
    "--status",
    type=click.Choice(["succeeded", "failed", "cancelled", "skipped", *STATUS_WORDS], case_sensitive=False),
    default=None,
    help="A finished state (completed = succeeded).",
)
@click.option("--since", default=None, help="Epoch seconds or an ISO 8601 time.")
def queue_history(limit: int, status: str | None, since: str | None) -> None:
    """Finished tasks, most recent first."""
    body = api().get("queue/history", limit=limit, status=status_word(status), since=since)
    console.print(tasks_table(body["tasks"]))
