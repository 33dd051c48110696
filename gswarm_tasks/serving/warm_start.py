"""The warm starter of the built-in model server: one process per node that has imported the server's libraries
(torch, transformers, sentence-transformers, Flask) once and forks a server for each start, so a replica starts in
the time its weights take to load (MiniLM from DRAM: about a second) instead of the many seconds its imports take.

The node worker asks it over a Unix socket in its private services directory, from its own user only (the peer's
uid is checked): a start gives the built-in server's arguments, its whole (minimal) environment and its log file;
the child starts a session of its own (the node stops it as any server: its process group) and the answer is its
pid. It runs nothing but `gswarm_tasks.serving.model_server`, never touches a GPU itself (a child sees the devices
of its own environment), and exits once the node worker that started it is gone.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SOCKET = "warm-start.sock"
PID_FILE = "warm-start.pid"
LOG = "warm-start.log"
MAX_REQUEST = 1 << 20
ANSWER_TIMEOUT_S = 10.0


class WarmStarter:
    """The node's side: start the warm starter if none runs, and ask it to start a server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock_path = root / SOCKET

    def _pid(self) -> int | None:
        try:
            pid = int((self.root / PID_FILE).read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if b"gswarm_tasks.serving.warm_start" in cmdline else None

    def ensure(self, env: dict[str, str], watch_pid: int) -> bool:
        """Start the warm starter unless one runs (or starts); True when one was started now."""
        with open(self.root / "warm-start.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._pid() is not None:
                return False
            argv = [sys.executable, "-m", "gswarm_tasks.serving.warm_start", "--socket", str(self.sock_path),
                    "--watch-pid", str(watch_pid)]  # fmt: skip
            with open(self.root / LOG, "ab") as logf:
                proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env=env)  # fmt: skip
            (self.root / PID_FILE).write_text(str(proc.pid))
            return True

    def spawn(self, args: list[str], env: dict[str, str], log: Path) -> int | None:
        """Start `python -m gswarm_tasks.serving.model_server ARGS` from the warm starter: its pid, or None when no warm
        starter answers (the caller starts the server the cold way)."""
        if self._pid() is None:
            return None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(ANSWER_TIMEOUT_S)
                conn.connect(str(self.sock_path))
                conn.sendall(json.dumps({"args": args, "env": env, "log": str(log)}).encode() + b"\n")
                answer = json.loads(_read_line(conn))
        except (OSError, ValueError):
            return None
        pid = answer.get("pid") if isinstance(answer, dict) else None
        return pid if isinstance(pid, int) and pid > 0 else None


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError("request too long")
    return data


def _preload() -> None:
    """Import what a built-in server imports to load a model (each optional: a node may lack one)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for name in ("gswarm_tasks.serving.model_server", "gswarm_tasks.serving.generation", "torch", "transformers",
                 "sentence_transformers", "transformers.models.bert.modeling_bert",
                 "transformers.models.gpt2.modeling_gpt2", "werkzeug.serving"):  # fmt: skip
        try:
            __import__(name)
        except Exception as exc:  # a library the node lacks: a server that needs it fails as it would cold
            print(f"warm start: {name} not preloaded: {exc}", flush=True)


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def _start(listener: socket.socket, conn: socket.socket, request: dict[str, Any]) -> int:
    """Fork a server for `request`; the child never returns."""
    args, env, log = request.get("args"), request.get("env"), request.get("log")
    if not (
        isinstance(args, list)
        and all(isinstance(a, str) for a in args)
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        and isinstance(log, str)
    ):
        raise ValueError("a start is {args: [str], env: {str: str}, log: str}")  # fmt: skip
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        os.setsid()
        listener.close()
        conn.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.environ.clear()
        os.environ.update(env)
        from gswarm_tasks.serving import model_server

        code = model_server.main(args)
    except BaseException as exc:  # the child must never return into the starter's loop
        print(
            f"gswarm-model-server: INTERNAL: warm start failed: {type(exc).__name__}: {exc}", file=sys.stderr
        )
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 3)


def _running(pid: int) -> bool:
    """Whether `pid` runs: a zombie (killed, its parent gone, not reaped yet) has ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def serve(sock_path: Path, watch_pid: int) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped at once: a dead server is no zombie
    _preload()
    sock_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(sock_path))
    finally:
        os.umask(old)
    listener.listen(16)
    listener.settimeout(1.0)
    print(f"warm start ready on {sock_path} (watching {watch_pid})", flush=True)
    while True:
        if not _running(watch_pid):
            sock_path.unlink(missing_ok=True)
            return 0
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            _answer(listener, conn)


def _answer(listener: socket.socket, conn: socket.socket) -> None:
    conn.settimeout(ANSWER_TIMEOUT_S)
    try:
        if not _same_user(conn):
            conn.sendall(b'{"error": "another user"}\n')
            return
        pid = _start(listener, conn, json.loads(_read_line(conn)))
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except (OSError, ValueError) as exc:
        print(f"warm start: refused a start: {exc}", flush=True)
        try:
            conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gswarm_tasks.serving.warm_start", description=__doc__.split("\n")[0]
    )
    p.add_argument("--socket", required=True, type=Path)
    p.add_argument(
        "--watch-pid", required=True, type=int, help="exit once this process (the node worker) is gone"
    )
    args = p.parse_args(argv)
    started = time.monotonic()
    code = serve(args.socket, args.watch_pid)
    print(f"warm start: node worker gone after {time.monotonic() - started:.0f} s; exiting", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
