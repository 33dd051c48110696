"""`gsmodel`: the original model manager's command, as its migration table says (`gsmodel` -> `gswarm model`).

Each command runs gswarm's with the same arguments (`gsmodel list -v` is `gswarm model list -v`, `gsmodel job F
--wait` is `gswarm workflow run F --wait`); the commands of the gRPC era (`start`, `connect`, `generate-grpc`) print
the one line to type now and exit 2.
"""

from __future__ import annotations

import shlex
import sys

import click

# gsmodel's command -> gswarm's, arguments passed as they are
MAPPED: dict[str, tuple[str, ...]] = {
    "register": ("model", "register"),
    "list": ("model", "list"),
    "info": ("model", "info"),
    "unregister": ("model", "delete"),
    "job": ("workflow", "run"),
    "jobs": ("workflow", "list"),
    "job-status": ("workflow", "status"),
    "example": ("workflow", "example"),
    "status": ("status",),
    "nodes": ("nodes",),
}
FORWARD = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _moved(now: str, note: str = "") -> None:
    """The one line a command of the gRPC era answers: what to type now."""
    click.echo(f"gsmodel: this is now `{now}`{note}", err=True)
    sys.exit(2)


@click.group()
@click.version_option(package_name="gswarm")
def main() -> None:
    """gsmodel, the original model manager's command, running gswarm's (`gswarm model`, `gswarm workflow`)."""


def _forward(verb: str, target: tuple[str, ...]) -> None:
    @main.command(
        verb, context_settings=FORWARD, help=f"`gswarm {' '.join(target)}` with the same arguments."
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def forwarded(args: tuple[str, ...]) -> None:
        from .. import main as gswarm

        rest = list(args)
        if verb == "example" and not any(a == "--output" or a.startswith("--output=") for a in rest):
            rest += ["--output", "examples"]  # gsmodel's default directory
        gswarm.main(args=[*target, *rest], prog_name="gswarm")


for _verb, _target in MAPPED.items():
    _forward(_verb, _target)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--host", default=None)
@click.option("--port", type=int, default=None, help="The head's gRPC port: now the broker's, `--port`.")
@click.option("--http-port", type=int, default=None, help="The head's HTTP API: now `--http-port`.")
@click.option("--background", is_flag=True)
@click.option("--data-dir", default=None, help="Now GSWARM_HOME.")
def start(
    host: str | None, port: int | None, http_port: int | None, background: bool, data_dir: str | None
) -> None:
    """The head node: now `gswarm host start`."""
    opts = [("--host", host), ("--port", port), ("--http-port", http_port)]
    cmd = "gswarm host start" + "".join(f" {k} {shlex.quote(str(v))}" for k, v in opts if v is not None)
    if data_dir:
        cmd = f"GSWARM_HOME={shlex.quote(data_dir)} {cmd}"
    _moved(cmd, " (in the background: under your service manager, or nohup ... &)" if background else "")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("head_address", required=False)
@click.option("--node-id", default=None)
def connect(head_address: str | None, node_id: str | None) -> None:
    """A client node: now `gswarm client connect`."""
    node = f" --node {shlex.quote(node_id)}" if node_id else ""
    _moved(f"gswarm client connect {head_address or 'HOST:8090'}{node}")


@main.command("generate-grpc")
def generate_grpc() -> None:
    """Nothing to generate: nodes join the host's broker (Celery on Redis), not a gRPC server."""
    _moved("gswarm client connect HOST:8090", " on each node: gswarm has no gRPC files to generate")


if __name__ == "__main__":
    main()
