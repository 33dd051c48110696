"""The fleet and its cost model: nodes, GPUs with memory, DRAM, bandwidths, and where each model's weights start.

A load's seconds depend on the fastest tier holding the weights: the GPU itself (0), the node's DRAM (a shard over
host-to-GPU), its disk, another node (network) or only the hub (download). Without a fleet description every load
takes the config's `load_time_seconds` and is reported as loaded from `config`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gswarm_tasks.devices import Device, validate_node_name

from .config import Config, ModelSpec, read_document
from .fields import choice, integer, mapping, no_extra, number, refuse, sequence, text

GB = 1e9
TIERS = ("gpu", "dram", "disk", "peer", "hub")
CAPACITY_RULES = ("one_model", "memory")
# A fleet file may leave bandwidths out: PCIe 4.0 x16, an NVMe disk, 10 GbE and a modest hub download.
DEFAULT_GB_PER_S = {"h2d_gb_per_s": 25.0, "disk_gb_per_s": 2.0, "network_gb_per_s": 1.25}
DEFAULT_HUB_GB_PER_S = 0.5
NODE_FIELDS = ("name", "gpus", "dram_gb", "bandwidths", *DEFAULT_GB_PER_S)
FLEET_FIELDS = ("nodes", "models", "defaults", "hub_gb_per_s", "capacity", "load_overhead_seconds")


@dataclass
class Fleet:
    """GPUs numbered 0..N-1 across nodes, with per-node bandwidths (bytes/s) and initial weight locations.

    `capacity` is the rule for what a GPU holds: `one_model` (one model resident at a time, the original's
    simplification and the default) or `memory` (any models whose shares fit its memory, least recently used
    evicted first). `uniform` fleets (no fleet file) charge every load the config's `load_time_seconds`.
    """

    node_names: list[str] = field(default_factory=list)
    gpu_node: list[int] = field(default_factory=list)  # per GPU, its node's position in `node_names`
    gpu_local: list[int] = field(default_factory=list)  # per GPU, its index on its node (the N of gpuN)
    gpu_memory_bytes: list[float] = field(default_factory=list)
    dram_bytes: list[float] = field(default_factory=list)  # per node, as the rest below
    h2d_bytes_per_s: list[float] = field(default_factory=list)
    disk_bytes_per_s: list[float] = field(default_factory=list)
    network_bytes_per_s: list[float] = field(default_factory=list)
    hub_bytes_per_s: float = DEFAULT_HUB_GB_PER_S * GB
    capacity: str = "one_model"
    load_overhead_seconds: float = 0.0
    uniform: bool = False
    # model -> [(node index, tier, global GPU index or -1)] at the start
    weights: dict[str, list[tuple[int, str, int]]] = field(default_factory=dict)
    size_bytes: dict[str, float] = field(default_factory=dict)

    @classmethod
    def single_node(cls, gpus: int) -> Fleet:
        """The fleet `--gpus N` means without a fleet file: one node with N GPUs, loads from the config."""
        inf = float("inf")
        return cls(
            node_names=["local"],
            gpu_node=[0] * gpus,
            gpu_local=list(range(gpus)),
            gpu_memory_bytes=[inf] * gpus,
            dram_bytes=[inf],
            h2d_bytes_per_s=[inf],
            disk_bytes_per_s=[inf],
            network_bytes_per_s=[inf],
            uniform=True,
        )

    @property
    def gpus(self) -> int:
        return len(self.gpu_node)

    def node_gpus(self) -> list[list[int]]:
        """Global GPU indices of each node."""
        out: list[list[int]] = [[] for _ in self.node_names]
        for g, n in enumerate(self.gpu_node):
            out[n].append(g)
        return out

    def gpu_name(self, g: int) -> str:
        """`node:gpuN`, the device name of GPU `g`."""
        return f"{self.node_names[self.gpu_node[g]]}:gpu{self.gpu_local[g]}"

    def model_bytes(self, model: ModelSpec) -> float:
        """Bytes of a model's weights: the fleet's `size_gb`, else its GPU memory in the config."""
        return self.size_bytes.get(model.name, model.memory_gb * GB)

    def load_seconds(self, model: ModelSpec, tier: str, node: int) -> float:
        """Seconds to bring `model` onto GPUs of `node` from `tier` (each GPU receives its shard in parallel)."""
        if tier == "gpu":
            return 0.0
        if self.uniform or tier == "config":
            return model.load_time_seconds
        size = self.model_bytes(model)
        h2d = size / model.gpus_required / self.h2d_bytes_per_s[node]
        source = {
            "dram": 0.0,
            "disk": size / self.disk_bytes_per_s[node],
            "peer": size / self.network_bytes_per_s[node],
            "hub": size / self.hub_bytes_per_s,
        }[tier]
        return self.load_overhead_seconds + max(h2d, source)

    def estimate(self, model: ModelSpec, gpus: Sequence[int]) -> tuple[float, str]:
        """Load seconds and tier for `model` on `gpus` from the weights' initial locations (live placement's view)."""
        if self.uniform:
            return model.load_time_seconds, "config"
        node = self.gpu_node[gpus[0]]
        places = self.weights.get(model.name, [])
        on_gpus = {g for n, t, g in places if t == "gpu"}
        if all(g in on_gpus for g in gpus):
            return 0.0, "gpu"
        here = {t for n, t, _ in places if n == node}
        # weights resident on a node's GPU came through that node, so its disk has them too
        tier = "dram" if "dram" in here else "disk" if here else "peer" if places else "hub"
        return self.load_seconds(model, tier, node), tier

    def load_estimate(self, model: str, gpus: Sequence[int]) -> tuple[float, str]:
        """Live placement's question: seconds and tier to bring `model` (by name, its size as the fleet knows it)
        onto `gpus` (global indices, one node), from where its weights are now."""
        if model not in self.size_bytes:
            raise refuse("model", f"the fleet does not know the size of {model!r}", model)
        if not gpus or any(not 0 <= g < self.gpus for g in gpus) or len({self.gpu_node[g] for g in gpus}) > 1:
            raise refuse("gpus", f"{list(gpus)} are not GPUs of one node of this fleet")
        spec = ModelSpec(model, self.size_bytes[model] / GB, len(gpus), 0.0)
        return self.estimate(spec, gpus)

    def check_config(self, config: Config, used: set[str], field_name: str = "fleet") -> None:
        """Refuse a model that a trace uses but no node can host (too few GPUs or too little memory per GPU)."""
        per_node = self.node_gpus()
        for name in sorted(used):
            m = config.models[name]
            share = m.memory_gb * GB / m.gpus_required
            best = max(
                (sum(1 for g in gs if self.gpu_memory_bytes[g] >= share) for gs in per_node), default=0
            )
            if best < m.gpus_required:
                raise refuse(
                    f"config.models.{name}.gpus_required",
                    f"needs {m.gpus_required} GPUs with {share / GB:g} GB each on one node; "
                    f"the best node of the {field_name} has {best}",
                )


def _gpus(doc: Any, field: str) -> list[float]:
    """GPU memory in bytes, one per GPU: `gpus: 4`, `{count, memory_gb}` or a list of `{memory_gb}`."""
    if isinstance(doc, int) and not isinstance(doc, bool):
        return [float("inf")] * integer(doc, field, minimum=1)
    if isinstance(doc, dict):
        no_extra(doc, field, ("count", "memory_gb"))
        count = integer(doc.get("count"), f"{field}.count", minimum=1)
        return [number(doc.get("memory_gb"), f"{field}.memory_gb", positive=True) * GB] * count
    items = sequence(doc, field)
    if not items:
        raise refuse(field, "a node needs at least one GPU")
    out = []
    for i, g in enumerate(items):
        gm = mapping(g, f"{field}[{i}]")
        no_extra(gm, f"{field}[{i}]", ("memory_gb", "name"))
        out.append(number(gm.get("memory_gb"), f"{field}[{i}].memory_gb", positive=True) * GB)
    return out


def _bandwidths(node: dict[str, Any], defaults: dict[str, Any], field: str) -> dict[str, float]:
    inline = {k: node[k] for k in DEFAULT_GB_PER_S if k in node}
    nested = mapping(node.get("bandwidths") or {}, f"{field}.bandwidths")
    no_extra(nested, f"{field}.bandwidths", tuple(DEFAULT_GB_PER_S))
    merged = {**DEFAULT_GB_PER_S, **defaults, **nested, **inline}
    return {k: number(v, f"{field}.{k}", positive=True) * GB for k, v in merged.items()}


def _weights(doc: Any, fleet: Fleet, field: str) -> None:
    index = {n: i for i, n in enumerate(fleet.node_names)}
    per_node = fleet.node_gpus()
    for name, entry in mapping(doc or {}, field).items():
        mf = f"{field}.{name}"
        if isinstance(entry, dict):
            no_extra(entry, mf, ("size_gb", "locations"))
            if entry.get("size_gb") is not None:
                fleet.size_bytes[name] = number(entry["size_gb"], f"{mf}.size_gb", positive=True) * GB
            entry = entry.get("locations") or []
            mf = f"{mf}.locations"
        places = []
        for i, loc in enumerate(sequence(entry, mf)):
            dev = Device.parse(text(loc, f"{mf}[{i}]"), f"{mf}[{i}]")
            if dev.node not in index or dev.tier == "cpu" or dev.index is not None:
                raise refuse(
                    f"{mf}[{i}]", f"{loc!r} is not a disk, dram or gpuN of a node in this fleet", loc
                )
            n = index[dev.node]
            if dev.is_gpu:
                gi = dev.gpu_index or 0
                if gi >= len(per_node[n]):
                    raise refuse(f"{mf}[{i}]", f"node {dev.node!r} has no GPU {gi}", loc)
                places.append((n, "gpu", per_node[n][gi]))
            else:
                places.append((n, dev.tier, -1))
        fleet.weights[name] = places


def parse_fleet(doc: Any, field: str = "fleet") -> Fleet:
    """A fleet document: nodes (GPUs, DRAM, bandwidths in GB/s), the capacity rule and initial weight locations."""
    f = mapping(doc, field)
    no_extra(f, field, FLEET_FIELDS)
    defaults = mapping(f.get("defaults") or {}, f"{field}.defaults")
    no_extra(defaults, f"{field}.defaults", tuple(DEFAULT_GB_PER_S))
    nodes = sequence(f.get("nodes"), f"{field}.nodes")
    if not nodes:
        raise refuse(f"{field}.nodes", "a fleet needs at least one node")
    fleet = Fleet()
    fleet.hub_bytes_per_s = (
        number(f.get("hub_gb_per_s"), f"{field}.hub_gb_per_s", positive=True, default=0.5) * GB
    )
    fleet.capacity = choice(f.get("capacity"), f"{field}.capacity", CAPACITY_RULES, default="one_model")
    fleet.load_overhead_seconds = number(
        f.get("load_overhead_seconds"), f"{field}.load_overhead_seconds", default=0
    )
    for i, raw in enumerate(nodes):
        nf = f"{field}.nodes[{i}]"
        node = mapping(raw, nf)
        no_extra(node, nf, NODE_FIELDS)
        name = validate_node_name(text(node.get("name"), f"{nf}.name"), f"{nf}.name")
        if name in fleet.node_names:
            raise refuse(f"{nf}.name", f"duplicate node {name!r}", name)
        bw = _bandwidths(node, defaults, nf)
        for local, mem in enumerate(_gpus(node.get("gpus"), f"{nf}.gpus")):
            fleet.gpu_node.append(len(fleet.node_names))
            fleet.gpu_local.append(local)
            fleet.gpu_memory_bytes.append(mem)
        fleet.node_names.append(name)
        fleet.dram_bytes.append(number(node.get("dram_gb"), f"{nf}.dram_gb", default=0.0) * GB)
        fleet.h2d_bytes_per_s.append(bw["h2d_gb_per_s"])
        fleet.disk_bytes_per_s.append(bw["disk_gb_per_s"])
        fleet.network_bytes_per_s.append(bw["network_gb_per_s"])
    _weights(f.get("models"), fleet, f"{field}.models")
    return fleet


def load_fleet(path: str) -> Fleet:
    """A fleet YAML (or JSON) file."""
    return parse_fleet(read_document(path))
