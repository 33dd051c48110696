"""A workflow document as typed values, made once at the edge (`schemas.parse_action`, `spec.validate`) and read by
everything after it: device fields are `Device` (or `Auto` until placement, or a `Ref` to an earlier step's output),
references are `Ref`, and the action and the workflow are frozen (placement and URL resolution make new ones).

`Action.params` is the JSON form a node receives: the same fields with devices and references written as text."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gswarm_tasks.devices import Auto, Device

REF_RE = re.compile(r"\$\{([^}]*)\}")


@dataclass(frozen=True)
class Ref:
    """`${step.field}`, `${step.output.field}` or `${step.output}`: an output of an earlier action, resolved on the
    node when the step runs. `text` is the expression as written (the node resolves it as written)."""

    step: str
    field: str
    text: str

    @classmethod
    def parse(cls, expr: str) -> Ref | None:
        """The expression between `${` and `}`; None when it is not one of the three forms."""
        parts = expr.strip().split(".")
        if len(parts) == 2:
            return cls(parts[0], parts[1], expr)
        if len(parts) == 3 and parts[1] == "output":
            return cls(parts[0], parts[2], expr)
        return None

    @classmethod
    def whole(cls, value: Any) -> Ref | None:
        """The reference a value is, when the whole value is one (`${load.chunk_id}`), else None."""
        m = REF_RE.fullmatch(value) if isinstance(value, str) else None
        return cls.parse(m.group(1)) if m is not None else None

    def __str__(self) -> str:
        return f"${{{self.text}}}"


# What a device field holds: a device, `auto` (placement chooses it at submission), or a reference.
Target = Device | Auto | Ref


@dataclass(frozen=True)
class ServeConfig:
    """A serve action's `config`: the preset and its parameters (`{"backend": ..., ...}`, sent to the node) and
    the keys that are the service's own (kept on the service)."""

    engine: Mapping[str, Any]
    own: Mapping[str, Any]


def wire(value: Any) -> Any:
    """A typed value as JSON: devices and references as their text, a serve config as its preset's mapping."""
    if isinstance(value, Device | Auto | Ref):
        return str(value)
    if isinstance(value, ServeConfig):
        return dict(value.engine)
    if isinstance(value, list):  # a data_merge's `inputs`: chunk ids and references
        return [wire(v) for v in value]
    return value


@dataclass(frozen=True)
class Action:
    """One action as parsed: its own fields typed (`fields`), where it runs, what it holds, what it references."""

    id: str
    type: str
    deps: tuple[str, ...]
    fields: Mapping[str, Any]
    priority: str = "normal"
    retries: int = 0
    retry_backoff: float = 1.0
    timeout_s: float | None = None
    node: str | None = None
    holds: tuple[
        Device, ...
    ] = ()  # devices it needs exclusively: `exclusive`, and a GPU it loads onto or serves on
    ref_sites: tuple[tuple[str, Ref], ...] = ()  # (field path, reference) for every `${...}` in its fields

    def device(self, key: str) -> Target | None:
        value = self.fields.get(key)
        return value if isinstance(value, Device | Auto | Ref) else None

    def text(self, key: str) -> str | None:
        """A field that is plain text (a model name, a URL), None when absent, a reference or not a string."""
        value = self.fields.get(key)
        return value if isinstance(value, str) else None

    @cached_property
    def params(self) -> dict[str, Any]:
        """The fields as a node receives them (JSON)."""
        out = {k: wire(v) for k, v in self.fields.items()}
        config = self.fields.get("config")
        if isinstance(config, ServeConfig) and config.own:
            out["service_config"] = dict(config.own)
        return out

    @property
    def exclusive(self) -> list[str]:
        return sorted({str(d) for d in self.holds})

    @property
    def refs(self) -> list[tuple[str, str, str]]:
        return [(path, r.step, r.field) for path, r in self.ref_sites]

    def with_fields(
        self, changed: Mapping[str, Any] | None = None, ref: tuple[str, Ref] | None = None
    ) -> Action:
        """The same action with some fields replaced (and a reference site added); a GPU it now targets is held."""
        fields = {**self.fields, **(changed or {})}
        holds = set(self.holds)
        if self.type in ("download", "move", "copy", "serve"):
            holds |= {
                d for k in ("target_device", "device") if isinstance(d := fields.get(k), Device) and d.is_gpu
            }
        sites = self.ref_sites + ((ref,) if ref is not None else ())
        return dataclasses.replace(self, fields=fields, holds=tuple(sorted(holds)), ref_sites=sites)


@dataclass(frozen=True)
class Workflow:
    name: str
    description: str
    queue_config: dict[str, Any]
    fail_fast: bool
    actions: tuple[Action, ...]

    def by_id(self) -> dict[str, Action]:
        return {a.id: a for a in self.actions}

    def with_actions(self, changed: Mapping[str, Action]) -> Workflow:
        """The same workflow with some actions replaced (by id)."""
        if not changed:
            return self
        return dataclasses.replace(self, actions=tuple(changed.get(a.id, a) for a in self.actions))
