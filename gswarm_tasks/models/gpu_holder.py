"""Holds a model's weights resident in one GPU's memory: the `gpuN` tier.

`python -m gswarm_tasks.models.gpu_holder --model-path DIR --device cuda:0 --host H --port P` loads every
safetensors file onto the GPU, then answers GET /health until SIGTERM frees the memory.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def load(model_path: Path, device: str) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    if not torch.cuda.is_available():
        raise SystemExit(f"RESOURCE_UNAVAILABLE: {device} is not available on this host (no CUDA)")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise SystemExit(
            f"RESOURCE_UNAVAILABLE: {device} is not available (this host has {torch.cuda.device_count()})"
        )
    before = torch.cuda.memory_allocated(index)
    tensors: dict[str, Any] = {}
    files = sorted(model_path.rglob("*.safetensors"))
    if not files:
        raise SystemExit(f"no safetensors files under {model_path}")
    for f in files:
        for name, t in load_file(str(f), device=device).items():
            tensors[f"{f.name}:{name}"] = t
    torch.cuda.synchronize(index)
    return {
        "tensors": tensors,
        "bytes_resident": int(sum(t.numel() * t.element_size() for t in tensors.values())),
        "memory_allocated_bytes": int(torch.cuda.memory_allocated(index) - before),
        "gpu_name": torch.cuda.get_device_name(index),
        "files": [str(f.relative_to(model_path)) for f in files],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True, type=Path)
    ap.add_argument("--device", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    t0 = time.time()
    state = load(args.model_path, args.device)
    info = {k: v for k, v in state.items() if k != "tensors"}
    info.update(status="ok", device=args.device, load_s=round(time.time() - t0, 3))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(info if self.path == "/health" else {"error": "not found"}).encode()
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"gswarm-gpu-holder ready: {json.dumps(info)}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
