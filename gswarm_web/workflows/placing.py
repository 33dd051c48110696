"""The `auto` devices of a workflow, chosen at submission in dependency order, so every step is routed to a real
node before anything runs.

A model follows its own trail through the workflow: a move or copy with an `auto` source starts from where an
earlier action (one it depends on) left the model, a GPU is loaded on the node that holds the copy, a serve runs
on the GPU its model was loaded onto (or, failing that, where its weights are), and a copy goes to a node that
does not hold the model yet. Everything else is `control.placement`'s choice. A step that cannot be placed (a GPU
step on a fleet without GPUs) refuses the whole workflow, naming the action and field.
"""

from __future__ import annotations

import re
from typing import Any

from gswarm_tasks.devices import Auto, Device, parse_target
from gswarm_tasks.errors import GswarmError, InvalidRequest

from ..control.fleet import current_view
from ..control.placement import choose, current_load, need_bytes
from ..extensions import db
from ..scheduling.placement import Load
from ..tables import ChunkLocation, Model
from .actions import AUTO_DEFAULTS, Action, is_auto
from .spec import Workflow, order_and_cycle, reach

# The device fields placement fills, per action type (a chunk's move or transfer names its device, or `auto`).
FIELDS = {**AUTO_DEFAULTS, "data_move": ("target_device",), "data_transfer": ("target_device",)}
REF_STEP = re.compile(r"^\$\{([A-Za-z0-9][A-Za-z0-9_.-]*?)\.")


class Placer:
    """Resolves one workflow's `auto` devices against one view of the fleet (memory it takes is counted).

    Actions are placed in dependency order. What an action depends on is `anc`, a bit per action (bit i: the i-th
    placed), handed over by `spec.reach`; where earlier actions left each model is kept as such bits too, so the
    nearest earlier action that left a model somewhere is one mask and one highest bit, whatever the length."""

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.by_id = wf.by_id()
        self.ids = order_and_cycle(self.by_id)[0]
        self.order = [self.by_id[aid] for aid in self.ids]
        self.position = {aid: i for i, aid in enumerate(self.ids)}
        self.anc = 0  # the actions the one being placed depends on, directly or not
        self.view = current_view()
        self.load: Load = current_load()
        self.models = {m.name: m for m in db.session.scalars(db.select(Model))}
        self.trail: dict[str, dict[str, list[str]]] = {}  # action -> model -> devices it left the model on
        self.left: dict[tuple[str, bool | None], int] = {}  # (model, on a GPU or not, or either) -> actions
        self.held: dict[tuple[str, str], dict[str, int]] = {}  # (model, tier) -> node -> actions that left it there
        self.decisions: dict[str, dict[str, Any]] = {}

    def model(self, a: Action) -> Model | None:
        name = a.params.get("model_name")
        return self.models.get(name) if isinstance(name, str) else None

    def last(self, a: Action, model: str, gpu: bool | None = None) -> str | None:
        """The device the nearest earlier action (one `a` depends on) left `model` on."""
        mask = self.anc & self.left.get((model, gpu), 0)
        if not mask:
            return None
        b = self.ids[mask.bit_length() - 1]
        for dev in reversed(self.trail[b][model]):
            if gpu is None or Device.parse(dev).is_gpu == gpu:
                return dev
        return None

    def remember(self, a: Action, model: str, kept: list[str]) -> None:
        """Record where `a` left `model`, for the actions that depend on it."""
        self.trail.setdefault(a.id, {})[model] = kept
        bit = 1 << self.position[a.id]
        for dev in kept:
            d = Device.parse(dev)
            for key in ((model, None), (model, d.is_gpu)):
                self.left[key] = self.left.get(key, 0) | bit
            nodes = self.held.setdefault((model, d.tier), {})
            nodes[str(d.node)] = nodes.get(str(d.node), 0) | bit

    def registry(self, model: Model | None, node: str | None = None) -> str | None:
        """A ready copy in the registry (on `node` when given): dram before disk."""
        locs = [
            loc
            for loc in (model.locations if model else [])
            if loc.status == "ready" and loc.tier in ("dram", "disk") and (node is None or loc.node == node)
        ]
        return sorted(locs, key=lambda loc: (loc.tier != "dram", loc.device))[0].device if locs else None

    def choose(self, a: Action, key: str, model: Model | None, action: str, target: Auto, **kw: Any) -> str:
        try:
            decision = choose(model, action, target, self.load, self.view, **kw)
        except GswarmError as exc:
            where = f"actions[{a.id}].{key}"
            raise type(exc)(f"{where}: {exc.message}", {**exc.details, "field": where}) from None
        device = str(decision["chosen"])
        if action in ("serve", "load") and Device.parse(device).is_gpu:
            self.load.reserved_bytes[device] = self.load.reserved_bytes.get(device, 0.0) + need_bytes(model)
        self.decisions.setdefault(a.id, {})[key] = decision
        return device

    def source(self, a: Action, model: Model | None) -> str:
        name = str(a.params.get("model_name"))
        found = self.last(a, name, gpu=False) or self.registry(model)
        if found is None:
            raise InvalidRequest(
                f"actions[{a.id}].source_device: no earlier action or registered copy of {name} to start from; "
                "name one",
                {"field": f"actions[{a.id}].source_device"},
            )
        return found

    def place(self, a: Action) -> None:
        p, model = a.params, self.model(a)
        name = p.get("model_name") if isinstance(p.get("model_name"), str) else None
        for key in FIELDS.get(a.type, ()):
            if is_auto(p.get(key)):
                target = parse_target(p[key], key)
                assert isinstance(target, Auto)
                p[key] = self.resolve(a, key, target, model, name)
        if name is not None:
            left = [p.get(k) for k in ("target_device", "device")] if a.type != "delete" else []
            self.remember(a, name, [d for d in left if isinstance(d, str) and ":" in d and "${" not in d])
        for key in ("target_device", "device"):  # a step that puts weights on a GPU holds that GPU
            dev = p.get(key)
            if a.type in ("download", "move", "copy", "serve") and isinstance(dev, str) and "${" not in dev:
                if ":" in dev and Device.parse(dev).is_gpu and dev not in a.exclusive:
                    a.exclusive = sorted({*a.exclusive, dev})

    def resolve(self, a: Action, key: str, target: Auto, model: Model | None, name: str | None) -> str:
        kind = target.kind
        if a.type == "download":
            return self.choose(a, key, model, "download", target)
        if a.type in ("move", "copy") and key == "source_device":
            return self.source(a, model)
        if a.type in ("move", "copy"):
            src = Device.parse(str(a.params["source_device"]))
            if kind == "gpu":
                return self.choose(a, key, model, "load", target, on_node=src.node)
            if a.type == "move":  # between tiers of the model's node
                return str(Device(src.node, kind or ("dram" if src.tier == "disk" else "disk")))
            self.load.holding = self.holding(name, kind or "disk")
            try:
                return self.choose(a, key, model, "copy", Auto(kind or "disk"))
            finally:
                self.load.holding = set()
        if a.type in ("data_move", "data_transfer"):
            return self.chunk_target(a, key, kind)
        if a.type == "serve":
            gpu = self.last(a, str(name), gpu=True) if name else None
            if gpu is not None and kind in (None, "gpu"):
                return gpu  # served where it was loaded
            where = (self.last(a, str(name), gpu=False) if name else None) or self.registry(model)
            node = Device.parse(where).node if where else None
            return self.choose(a, key, model, "serve", target, on_node=node)
        return self.choose(a, key, None, "data", target)

    def chunk_node(self, a: Action) -> str | None:
        """The node holding the chunk `a` moves: where the step that made it put it, or a registered copy."""
        ref = a.params.get("data_id")
        if not isinstance(ref, str):
            return None
        m = REF_STEP.match(ref)
        if m is not None:
            maker = self.by_id.get(m.group(1))
            for key in ("target_device", "output_device"):
                dev = maker.params.get(key) if maker is not None else None
                if isinstance(dev, str) and ":" in dev and "${" not in dev and not is_auto(dev):
                    return Device.parse(dev).node
            return None
        loc = db.session.scalar(db.select(ChunkLocation).where(ChunkLocation.chunk_id == ref).limit(1))
        return loc.node if loc is not None else None

    def chunk_target(self, a: Action, key: str, kind: str | None) -> str:
        """A data_move stays on the chunk's node (to dram, or the tier named); a data_transfer goes to another node."""
        if kind not in (None, "dram", "disk"):
            field = f"actions[{a.id}].{key}"
            raise InvalidRequest(f"{field}: a chunk lives on dram or disk, not {kind}", {"field": field})
        node = self.chunk_node(a)
        if a.type == "data_move":
            if node is None:
                raise InvalidRequest(
                    f"actions[{a.id}].{key}: where the chunk is is not known at submission; name the device",
                    {"field": f"actions[{a.id}].{key}"},
                )
            return str(Device(node, kind or "dram"))
        self.load.exclude = {node} if node else set()
        try:
            return self.choose(a, key, None, "data", Auto(kind or "dram"))
        finally:
            self.load.exclude = set()

    def holding(self, name: str | None, tier: str) -> set[str]:
        """Nodes already holding the model on `tier`: where earlier actions left it, and the registry's copies."""
        if name is None:
            return set()
        nodes = {node for node, bits in self.held.get((name, tier), {}).items() if bits & self.anc}
        model = self.models.get(name)
        ready = [loc.device for loc in (model.locations if model else []) if loc.status == "ready"]
        return nodes | {str(d.node) for d in map(Device.parse, ready) if d.tier == tier}


def place_workflow(wf: Workflow) -> dict[str, dict[str, Any]]:
    """Resolve every `auto` device of `wf` in place; returns, per action, the placement decision of each field."""
    if not any(is_auto(a.params.get(k)) for a in wf.actions for k in FIELDS.get(a.type, ())):
        return {}
    placer = Placer(wf)
    for aid, bits in reach(placer.by_id, placer.ids, placer.ids):
        placer.anc = bits
        placer.place(placer.by_id[aid])
    return placer.decisions
