"""The scheduler's config in the original's JSON format: models and workflow DAGs, checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .documents import read_document
from .fields import integer, mapping, number, refuse, sequence, text


@dataclass(frozen=True)
class ModelSpec:
    """A model as the config describes it: GPU memory, GPUs per instance, load time and speed."""

    name: str
    memory_gb: float
    gpus_required: int
    load_time_seconds: float
    tokens_per_second: float | None = None
    token_mean: float | None = None
    inference_time_mean: float | None = None

    def derived_seconds(self, node_config: dict[str, Any]) -> float | None:
        """Execution time when a request gives none: tokens / tokens_per_second, else the mean inference time."""
        tokens = node_config.get("tokens", node_config.get("max_tokens"))
        if self.tokens_per_second:
            if isinstance(tokens, int | float) and not isinstance(tokens, bool) and tokens > 0:
                return float(tokens) / self.tokens_per_second
            if self.token_mean:
                return self.token_mean / self.tokens_per_second
        return self.inference_time_mean


@dataclass(frozen=True)
class WorkflowSpec:
    """A workflow DAG: node ids and models in a topological order, with each node's parents by position."""

    name: str
    node_ids: tuple[str, ...]
    models: tuple[str, ...]
    parents: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Config:
    """Models by name and workflows by id."""

    models: dict[str, ModelSpec]
    workflows: dict[str, WorkflowSpec]


def _optional(value: Any, field: str) -> float | None:
    return None if value is None else number(value, field, positive=True)


def parse_model(name: str, doc: Any, field: str) -> ModelSpec:
    """One entry of `models`; fields the scheduler does not use (type, config, token_std, ...) are allowed."""
    m = mapping(doc, field)
    return ModelSpec(
        name=name,
        memory_gb=number(m.get("memory_gb"), f"{field}.memory_gb", positive=True),
        gpus_required=integer(m.get("gpus_required"), f"{field}.gpus_required", minimum=1, default=1),
        load_time_seconds=number(m.get("load_time_seconds"), f"{field}.load_time_seconds"),
        tokens_per_second=_optional(m.get("tokens_per_second"), f"{field}.tokens_per_second"),
        token_mean=_optional(m.get("token_mean"), f"{field}.token_mean"),
        inference_time_mean=_optional(m.get("inference_time_mean"), f"{field}.inference_time_mean"),
    )


def _topological(wf_field: str, ids: list[str], parents: list[list[int]]) -> list[int]:
    """Kahn's order of the nodes; a cycle is refused naming one node on it."""
    children: list[list[int]] = [[] for _ in ids]
    missing = [len(p) for p in parents]
    for i, ps in enumerate(parents):
        for p in ps:
            children[p].append(i)
    order = [i for i, n in enumerate(missing) if n == 0]
    for i in order:
        for c in children[i]:
            missing[c] -= 1
            if missing[c] == 0:
                order.append(c)
    if len(order) < len(ids):
        stuck = next(ids[i] for i, n in enumerate(missing) if n)
        raise refuse(f"{wf_field}.edges", f"the edges form a cycle through {stuck!r}")
    return order


def parse_workflow(wid: str, doc: Any, models: dict[str, ModelSpec], field: str) -> WorkflowSpec:
    """One entry of `workflows`: unique node ids, known models, and edges between existing nodes, without cycles."""
    w = mapping(doc, field)
    nodes = sequence(w.get("nodes"), f"{field}.nodes")
    if not nodes:
        raise refuse(f"{field}.nodes", "a workflow needs at least one node")
    ids: list[str] = []
    node_models: list[str] = []
    for i, node in enumerate(nodes):
        nf = f"{field}.nodes[{i}]"
        n = mapping(node, nf)
        nid = text(n.get("id"), f"{nf}.id")
        if nid in ids:
            raise refuse(f"{nf}.id", f"duplicate node id {nid!r}", nid)
        model = text(n.get("model"), f"{nf}.model")
        if model not in models:
            raise refuse(f"{nf}.model", f"unknown model {model!r}", model)
        ids.append(nid)
        node_models.append(model)
    index = {nid: i for i, nid in enumerate(ids)}
    parents: list[list[int]] = [[] for _ in ids]
    for j, edge in enumerate(sequence(w.get("edges", []), f"{field}.edges")):
        ef = f"{field}.edges[{j}]"
        e = mapping(edge, ef)
        src, dst = text(e.get("from"), f"{ef}.from"), text(e.get("to"), f"{ef}.to")
        for end, name in (("from", src), ("to", dst)):
            if name not in index:
                # The original dropped the step silently here; refusing names the workflow and the edge.
                raise refuse(
                    f"{ef}.{end}", f"edge {src!r} -> {dst!r} of workflow {wid!r} names no node {name!r}"
                )
        if src == dst:
            raise refuse(ef, f"edge {src!r} -> {dst!r} of workflow {wid!r} is a self-loop")
        if index[src] not in parents[index[dst]]:
            parents[index[dst]].append(index[src])
    order = _topological(field, ids, parents)
    position = {old: new for new, old in enumerate(order)}
    return WorkflowSpec(
        name=wid,
        node_ids=tuple(ids[i] for i in order),
        models=tuple(node_models[i] for i in order),
        parents=tuple(tuple(sorted(position[p] for p in parents[i])) for i in order),
    )


def parse_config(doc: Any, field: str = "config") -> Config:
    """The whole config document (`models`, `workflows`), every field checked."""
    c = mapping(doc, field)
    raw_models = mapping(c.get("models"), f"{field}.models")
    if not raw_models:
        raise refuse(f"{field}.models", "at least one model is needed")
    models = {name: parse_model(name, m, f"{field}.models.{name}") for name, m in raw_models.items()}
    raw_wfs = mapping(c.get("workflows"), f"{field}.workflows")
    if not raw_wfs:
        raise refuse(f"{field}.workflows", "at least one workflow is needed")
    workflows = {
        wid: parse_workflow(wid, w, models, f"{field}.workflows.{wid}") for wid, w in raw_wfs.items()
    }
    return Config(models=models, workflows=workflows)


def load_config(path: str | Path) -> Config:
    """The config file (JSON, or the same document as YAML)."""
    return parse_config(read_document(path))
