"""The `auto` devices of a workflow, chosen at submission in dependency order, so every step is routed to a real
node before anything runs.

A model follows its own trail through the workflow: a move or copy with an `auto` source starts from where an
earlier action (one it depends on) left the model, a GPU is loaded on the node that holds the copy, a serve runs
on the GPU its model was loaded onto (or, failing that, where its weights are), and a copy goes to a node that
does not hold the model yet. Everything else is `control.placement`'s choice. A step that cannot be placed (a GPU
step on a fleet without GPUs) refuses the whole workflow, naming the action and field.
"""

from __future__ import annotations

from typing import Any

from gswarm_tasks.devices import Auto, Device
from gswarm_tasks.errors import GswarmError, InvalidRequest

from ..control.nodes.fleet import current_view
from ..control.nodes.placement import choose, current_load, need_bytes
from ..extensions import db
from ..scheduling.ranking import Load
from ..tables import ChunkLocation, Model, ModelLocation
from .document import Action, Ref, Workflow
from .rules import PLACED
from .spec import order_and_cycle, reach


class Placer:
    """Resolves one workflow's `auto` devices against one view of the fleet (memory it takes is counted).

    Actions are placed in dependency order. What an action depends on is `anc`, a bit per action (bit i: the i-th
    placed), handed over by `spec.reach`; where earlier actions left each model is kept as such bits too, so the
    nearest earlier action that left a model somewhere is one mask and one highest bit, whatever the length."""

    def __init__(self, wf: Workflow) -> None:
        self.by_id = wf.by_id()
        self.ids = order_and_cycle(self.by_id)[0]
        self.position = {aid: i for i, aid in enumerate(self.ids)}
        self.anc = 0  # the actions the one being placed depends on, directly or not
        self.view = current_view()
        self.load: Load = current_load()
        self.models = {m.name: m for m in db.session.scalars(db.select(Model))}
        self.trail: dict[str, dict[str, list[Device]]] = {}  # action -> model -> devices it left the model on
        self.left: dict[tuple[str, bool | None], int] = {}  # (model, on a GPU or not, or either) -> actions
        self.held: dict[
            tuple[str, str], dict[str, int]
        ] = {}  # (model, tier) -> node -> actions that left it there
        self.decisions: dict[str, dict[str, Any]] = {}
        self.placed: dict[str, Action] = {}  # the actions with their devices chosen

    def model(self, a: Action) -> Model | None:
        name = a.text("model_name")
        return self.models.get(name) if name is not None else None

    def last(self, a: Action, model: str, gpu: bool | None = None) -> Device | None:
        """The device the nearest earlier action (one `a` depends on) left `model` on."""
        mask = self.anc & self.left.get((model, gpu), 0)
        if not mask:
            return None
        b = self.ids[mask.bit_length() - 1]
        for dev in reversed(self.trail[b][model]):
            if gpu is None or dev.is_gpu == gpu:
                return dev
        return None

    def remember(self, a: Action, model: str, kept: list[Device]) -> None:
        """Record where `a` left `model`, for the actions that depend on it."""
        self.trail.setdefault(a.id, {})[model] = kept
        bit = 1 << self.position[a.id]
        for d in kept:
            for key in ((model, None), (model, d.is_gpu)):
                self.left[key] = self.left.get(key, 0) | bit
            nodes = self.held.setdefault((model, d.tier), {})
            nodes[str(d.node)] = nodes.get(str(d.node), 0) | bit

    def registry(self, model: Model | None, node: str | None = None) -> Device | None:
        """A ready copy in the registry (on `node` when given): dram before disk."""
        locs = [
            loc
            for loc in (model.locations if model else [])
            if loc.status == "ready" and loc.tier in ("dram", "disk") and (node is None or loc.node == node)
        ]
        return _at(sorted(locs, key=lambda loc: (loc.tier != "dram", loc.device))[0]) if locs else None

    def choose(
        self, a: Action, key: str, model: Model | None, action: str, target: Auto, **kw: Any
    ) -> Device:
        try:
            decision = choose(model, action, target, self.load, self.view, **kw)
        except GswarmError as exc:
            where = f"actions[{a.id}].{key}"
            raise type(exc)(f"{where}: {exc.message}", {**exc.details, "field": where}) from None
        device = Device.parse(str(decision["chosen"]))  # the one device placement's answer names
        if action in ("serve", "load") and device.is_gpu:
            self.load.reserved_bytes[str(device)] = self.load.reserved_bytes.get(
                str(device), 0.0
            ) + need_bytes(model)
        self.decisions.setdefault(a.id, {})[key] = decision
        return device

    def source(self, a: Action, model: Model | None) -> Device:
        name = str(a.text("model_name"))
        found = self.last(a, name, gpu=False) or self.registry(model)
        if found is None:
            raise InvalidRequest(
                f"actions[{a.id}].source_device: no earlier action or registered copy of {name} to start from; "
                "name one",
                {"field": f"actions[{a.id}].source_device"},
            )
        return found

    def place(self, a: Action) -> None:
        model, name = self.model(a), a.text("model_name")
        for key in PLACED.get(a.type, ()):
            target = a.device(key)
            if isinstance(target, Auto):
                a = a.with_fields({key: self.resolve(a, key, target, model, name)})
        if name is not None:
            left = [a.device(k) for k in ("target_device", "device")] if a.type != "delete" else []
            self.remember(a, name, [d for d in left if isinstance(d, Device)])
        self.placed[a.id] = self.by_id[a.id] = a

    def resolve(self, a: Action, key: str, target: Auto, model: Model | None, name: str | None) -> Device:
        kind = target.kind
        if a.type == "download":
            return self.choose(a, key, model, "download", target)
        if a.type in ("move", "copy") and key == "source_device":
            return self.source(a, model)
        src = a.device("source_device")
        if a.type in ("move", "copy"):
            if not isinstance(src, Device):
                where = f"actions[{a.id}].{key}"
                raise InvalidRequest(
                    f"{where}: placement needs the source device at submission; name one", {"field": where}
                )
            if kind == "gpu":
                return self.choose(a, key, model, "load", target, on_node=src.node)
            if a.type == "move":  # between tiers of the model's node
                return Device(src.node, kind or ("dram" if src.tier == "disk" else "disk"))
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
            copy = (self.last(a, str(name), gpu=False) if name else None) or self.registry(model)
            return self.choose(a, key, model, "serve", target, on_node=copy.node if copy else None)
        return self.choose(a, key, None, "data", target)

    def chunk_node(self, a: Action) -> str | None:
        """The node holding the chunk `a` moves: where the step that made it put it, or a registered copy."""
        ref = a.fields.get("data_id")
        if isinstance(ref, Ref):
            maker = self.by_id.get(ref.step)
            for key in ("target_device", "output_device"):
                dev = maker.device(key) if maker is not None else None
                if isinstance(dev, Device):
                    return dev.node
            return None
        if not isinstance(ref, str):
            return None
        loc = db.session.scalar(db.select(ChunkLocation).where(ChunkLocation.chunk_id == ref).limit(1))
        return loc.node if loc is not None else None

    def chunk_target(self, a: Action, key: str, kind: str | None) -> Device:
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
            return Device(node, kind or "dram")
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
        return nodes | {
            loc.node
            for loc in (model.locations if model else [])
            if loc.status == "ready" and loc.tier == tier
        }


def _at(loc: ModelLocation) -> Device:
    """A registry row's device, from its node and tier columns."""
    return Device(loc.node, loc.tier)


def place_workflow(wf: Workflow) -> tuple[Workflow, dict[str, dict[str, Any]]]:
    """`wf` with every `auto` device chosen, and per action the placement decision of each field."""
    if not any(isinstance(a.device(k), Auto) for a in wf.actions for k in PLACED.get(a.type, ())):
        return wf, {}
    placer = Placer(wf)
    for aid, bits in reach(placer.by_id, placer.ids, placer.ids):
        placer.anc = bits
        placer.place(placer.by_id[aid])
    return wf.with_actions(placer.placed), placer.decisions
