"""The cluster test's hub: tests/harness/hfserver.py on 0.0.0.0:8000 inside the compose network, serving the real MiniLM
files as `sentence-transformers/all-MiniLM-L6-v2` and a generated blob repo (`gswarm-test/blob`, random bytes) that
chunks are created from over plain HTTP. Run as `python tests/cluster/hub.py MODEL_DIR BLOB_MIB`."""

from __future__ import annotations

import os
import sys
import tempfile
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness import hfserver  # noqa: E402

MODEL_REPO = "sentence-transformers/all-MiniLM-L6-v2"
BLOB_REPO = "gswarm-test/blob"
PORT = 8000


def make_blob(root: Path, mib: int) -> Path:
    """A repo directory with one file of `mib` MiB of random bytes (written a MiB at a time)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "blob.bin", "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    return root


def main(model_dir: str, blob_mib: str) -> None:
    blob = make_blob(Path(tempfile.mkdtemp(prefix="hub-")) / "blob", int(blob_mib))
    server = hfserver.HfTestServer({MODEL_REPO: Path(model_dir), BLOB_REPO: blob})
    server.repos = {repo: hfserver._index_repo(d) for repo, d in server._dirs.items()}
    handler = type("_BoundHandler", (hfserver._Handler,), {"hub": server})
    httpd = ThreadingHTTPServer(("0.0.0.0", PORT), handler)
    httpd.daemon_threads = True
    print(f"hub serving {', '.join(server.repos)} on :{PORT}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:3])
