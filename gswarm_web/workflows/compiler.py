"""From a validated workflow to what is sent: linear stretches become Celery chains, the rest is the
dispatcher's. A step continues its parent's chain only when it is the parent's one dependent and the
parent is its one dependency, so no chain ever waits for something the YAML did not ask it to."""

from __future__ import annotations

from gswarm_tasks import names
from gswarm_tasks.devices import Device

from .actions import Action
from .spec import Workflow


def segments(wf: Workflow) -> list[list[Action]]:
    """Maximal chains of the DAG, each listed in execution order; every action is in exactly one."""
    by_id = wf.by_id()
    children: dict[str, list[str]] = {a.id: [] for a in wf.actions}
    for a in wf.actions:
        for d in a.deps:
            children[d].append(a.id)

    def continues(a: Action) -> bool:
        return len(a.deps) == 1 and len(children[a.deps[0]]) == 1

    out: list[list[Action]] = []
    for a in wf.actions:
        if continues(a):
            continue
        seg = [a]
        while len(children[seg[-1].id]) == 1 and continues(by_id[children[seg[-1].id][0]]):
            seg.append(by_id[children[seg[-1].id][0]])
        out.append(seg)
    return out


def step_device(a: Action) -> str | None:
    p = a.params
    if a.type in ("download", "move", "copy"):
        return p.get("target_device")
    if a.type in ("serve", "stop_serve", "delete"):
        return p.get("device")
    if a.type in ("data_create", "data_move", "data_transfer"):
        return p.get("target_device")
    if a.type in ("inference", "data_merge"):
        return p.get("output_device")
    return None


def step_queue(a: Action) -> str:
    """The queue a step runs on: its device's node, the action's `node`, else the control queue."""
    dev = step_device(a)
    if dev and "${" not in dev:
        node = Device.parse(dev).node
        if node is not None:
            return node
    return a.node or names.CONTROL_QUEUE
