"""The workflow examples of the original gswarm docs: `RUNNABLE` (with `auto` devices, what `gswarm workflow
example` writes; they run wherever the hardware allows) and `EXAMPLES` (verbatim, in `original/`, naming the
original's node1 and node2)."""

from __future__ import annotations

from importlib import resources

ORDER = (
    "simple-deployment",
    "multi-model-deployment",
    "distributed-deployment",
    "data-pipeline-chaining",
    "model-deployment-with-data",
    "multi-stage-pipeline",
    "serve-with-config",
)


def _load(sub: str | None = None) -> dict[str, str]:
    folder = resources.files(__name__)
    if sub is not None:
        folder = folder.joinpath(sub)
    return {name: folder.joinpath(f"{name}.yaml").read_text() for name in ORDER}


EXAMPLES: dict[str, str] = _load("original")
RUNNABLE: dict[str, str] = _load()
