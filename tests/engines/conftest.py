"""Real inference engines (vLLM's CPU build, llama.cpp's llama-server) behind gswarm, with real workers: the modules
here run only under `make test-engines` (GSWARM_ENGINE_TEST=1, after scripts/engines.sh installed the engines into
GSWARM_ENGINES_DIR); `make test` does not collect them."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("GSWARM_ENGINE_TEST") == "1" else ["test_*.py"]
