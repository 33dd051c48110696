"""From a validated workflow to what is sent: linear stretches become Celery chains, the rest is the
dispatcher's. A step continues its parent's chain only when it is the parent's one dependent and the
parent is its one dependency, so no chain ever waits for something the YAML did not ask it to."""

from __future__ import annotations

from gswarm_tasks import names
from gswarm_tasks.devices import Device

from .document import Action, Target, Workflow


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


# The field that says where a step runs, per action type.
STEP_DEVICE = {
    **dict.fromkeys(
        ("download", "move", "copy", "data_create", "data_move", "data_transfer"), "target_device"
    ),
    **dict.fromkeys(("serve", "stop_serve", "delete"), "device"),
    **dict.fromkeys(("inference", "data_merge"), "output_device"),
}


def step_device(a: Action) -> Target | None:
    key = STEP_DEVICE.get(a.type)
    return a.device(key) if key else None


def step_queue(a: Action) -> str:
    """The queue a step runs on: its device's node, the action's `node`, else the control queue."""
    dev = step_device(a)
    if isinstance(dev, Device) and dev.node is not None:
        return dev.node
    return a.node or names.CONTROL_QUEUE
