"""Workflow documents at scale: seconds and peak memory (tracemalloc) to load, validate and compile chains of 4,000
and 20,000 actions (listed in order, in reverse order, referencing a far ancestor) and to place a model moved along
a chain, and how fast hostile documents are refused (a 600-byte YAML alias bomb, JSON nested 10,000 deep).

Each case runs in a child process under a memory limit and a time limit. `--tree DIR` runs the same cases against
another checkout, for a before/after comparison:

    git archive <commit> gswarm_tasks gswarm_web | tar -x -C /tmp/before
    .venv/bin/python -m bench.documents --tree /tmp/before --sizes 1000,2000,4000
    .venv/bin/python -m bench.documents --sizes 4000,20000

Growth is judged as the ratio of the largest to the smallest size's figures against the ratio of the sizes:
about 1 is linear, about the size ratio again is quadratic.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

CASES = ("chain", "reverse", "far_refs", "moves")
HOSTILE = ("alias_bomb", "deep_json")


def _alias_bomb() -> str:
    """About 600 bytes that expand to 10^9 strings (the same list referenced ten times, nine levels deep)."""
    lines = ["name: bomb", f"l0: &l0 [{','.join(['lolololol'] * 10)}]"]
    for i in range(1, 9):
        lines.append(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 10)}]")
    lines.append("actions: [{action_id: a, action_type: noop, outputs: {k: *l8}}]")
    return "\n".join(lines) + "\n"


def document(case: str, n: int) -> str:
    """The case's document as the API receives it (YAML; JSON for the deep case)."""
    import yaml

    if case == "alias_bomb":
        return _alias_bomb()
    if case == "deep_json":
        return '{"name": "deep", "actions": ' + "[" * n + "]" * n + "}"
    if case == "moves":
        acts: list[dict[str, Any]] = [
            {"action_id": "a0", "action_type": "download", "model_name": "m", "target_device": "node1:disk"}
        ]
        for i in range(1, n):
            tier = "dram" if i % 2 else "disk"
            acts.append(
                {
                    "action_id": f"a{i}",
                    "action_type": "move",
                    "model_name": "m",
                    "source_device": "auto",
                    "target_device": f"auto:{tier}",
                    "dependencies": [f"a{i - 1}"],
                }
            )
    else:
        acts = [{"action_id": "a0", "action_type": "noop", "outputs": {"x": 1}}]
        for i in range(1, n):
            ref = "${a0.x}" if case == "far_refs" else f"${{a{i - 1}.x}}"
            acts.append(
                {
                    "action_id": f"a{i}",
                    "action_type": "noop",
                    "dependencies": [f"a{i - 1}"],
                    "outputs": {"x": ref},
                }
            )
        if case == "reverse":
            acts.reverse()
    return yaml.safe_dump({"name": f"{case}-{n}", "actions": acts}, sort_keys=False)


def _app(tmp: str) -> Any:
    """An app on SQLite with two nodes and a downloaded model, for placement."""
    from datetime import UTC, datetime

    from gswarm_tasks.settings import Settings
    from gswarm_web import create_app
    from gswarm_web.extensions import db
    from gswarm_web.tables import Model, Node

    app = create_app(Settings(home=tmp, database_url=f"sqlite:///{tmp}/bench.db"))
    with app.app_context():
        db.create_all()
        now = datetime.now(UTC)
        for name in ("node1", "node2"):
            db.session.add(
                Node(name=name, dram_total_bytes=64 << 30, dram_available_bytes=60 << 30, last_seen=now)
            )
        db.session.add(
            Model(name="m", model_type="llm", source_url="hf://org/m", model_size=1 << 30, locations=[])
        )
        db.session.commit()
    return app


def _work(case: str, text: str, app: Any) -> None:
    from gswarm_web.workflows import spec
    from gswarm_web.workflows.compiler import segments
    from gswarm_web.workflows.placing import place_workflow

    spec.MAX_ACTIONS = 10**6  # the 20,000 case measures growth past the API's cap
    wf = spec.validate(spec.load_document(text))
    segments(wf)
    if app is not None:
        with app.app_context():
            place_workflow(wf)


def child(case: str, n: int, tree: str | None) -> dict[str, Any]:
    """Run one case here: seconds untraced, then peak memory traced."""
    if tree:
        sys.path.insert(0, tree)
    import gswarm_web.workflows.placing  # noqa: F401  (imports are not what is measured)

    text = document(case, n)
    tmp = tempfile.mkdtemp(prefix="gswarm-bench-docs-")
    app = _app(tmp) if case == "moves" else None
    out: dict[str, Any] = {"case": case, "n": n, "bytes": len(text)}
    try:
        t0 = time.perf_counter()
        _work(case, text, app)
        out["seconds"] = round(time.perf_counter() - t0, 3)
        out["outcome"] = "accepted"
    except Exception as exc:  # a refusal is the expected outcome of the hostile cases
        out["seconds"] = round(time.perf_counter() - t0, 3)
        out["outcome"] = f"{type(exc).__name__}: {str(exc)[:100]}"
    tracemalloc.start()
    try:
        _work(case, text, app)
    except Exception:
        pass
    out["peak_mib"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
    tracemalloc.stop()
    return out


def run_case(case: str, n: int, tree: str | None, limit_mb: int, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.documents", "--child", case, str(n)] + (
        ["--tree", tree] if tree else []
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))

    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, preexec_fn=limit, check=False
        )
    except subprocess.TimeoutExpired:
        return {"case": case, "n": n, "outcome": f"still running after {timeout:.0f} s (stopped)"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"case": case, "n": n, "outcome": f"died ({last[:100]}; limit {limit_mb} MiB)"}
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4000,20000", help="chain lengths, comma-separated")
    ap.add_argument("--cases", default=",".join(CASES + HOSTILE))
    ap.add_argument("--tree", help="run another checkout's gswarm_tasks and gswarm_web")
    ap.add_argument("--limit-mb", type=int, default=4096, help="address-space limit of each case's process")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds each case may run")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.tree)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for case in args.cases.split(","):
        for n in sizes if case in CASES else [10_000 if case == "deep_json" else 0]:
            row = run_case(case, n, args.tree, args.limit_mb, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"{'case':<11} {'actions':>8} {'seconds':>9} {'peak MiB':>9}  outcome")
    for r in rows:
        print(
            f"{r['case']:<11} {r['n']:>8} {r.get('seconds', '-'):>9} {r.get('peak_mib', '-'):>9}  {r['outcome']}"
        )
    for case in CASES:
        done = [r for r in rows if r["case"] == case and "peak_mib" in r]
        if len(done) >= 2 and done[0]["n"] and done[0]["seconds"]:
            lo, hi = done[0], done[-1]
            size = hi["n"] / lo["n"]
            print(
                f"{case}: x{size:.0f} actions -> time x{hi['seconds'] / lo['seconds']:.1f}, "
                f"memory x{hi['peak_mib'] / max(lo['peak_mib'], 0.1):.1f} (linear: about x{size:.0f})"
            )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GSWARM_LOG_LEVEL", "WARNING")
    sys.exit(main())
