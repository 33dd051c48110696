"""The workflow examples of the original gswarm docs (one YAML file each; `gswarm workflow example` writes them)."""

from __future__ import annotations

from importlib import resources

ORDER = (
    "simple-deployment",
    "multi-model-deployment",
    "distributed-deployment",
    "data-pipeline-chaining",
    "model-deployment-with-data",
    "multi-stage-pipeline",
)


def _load() -> dict[str, str]:
    folder = resources.files(__name__)
    return {name: folder.joinpath(f"{name}.yaml").read_text() for name in ORDER}


EXAMPLES: dict[str, str] = _load()
