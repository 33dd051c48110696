"""Device and node names: the one parser for `<node>:<tier>[:<index>]`, and safe storage paths."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import InvalidRequest, NotFound

NODE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
TIER_RE = re.compile(r"^(disk|dram|cpu|gpu(0|[1-9][0-9]{0,2}))$")
# Names that are queues of the system itself and so cannot be a node's queue.
RESERVED_NODE_NAMES = frozenset({"control", "celery", "web", "default"})
STORAGE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+=-]{0,199}$")
FILE_TIERS = ("disk", "dram")
AUTO = "auto"
AUTO_KINDS = ("gpu", "cpu", "dram", "disk")  # `auto:<kind>`: placement chooses a device of this kind


def validate_node_name(name: str, field: str = "node") -> str:
    """Return `name` if it is a valid node name, else raise InvalidRequest naming `field`."""
    if not isinstance(name, str) or not NODE_NAME_RE.match(name):
        raise InvalidRequest(
            f"{field}: {name!r} is not a valid node name (lowercase letters, digits and '-', 1-63 chars)",
            {"field": field, "value": name},
        )
    if name in RESERVED_NODE_NAMES:
        raise InvalidRequest(f"{field}: {name!r} is reserved", {"field": field, "value": name})
    return name


@dataclass(frozen=True, order=True)
class Device:
    """A place something can live: `node1:disk`, `node1:dram`, `node1:gpu0`, `node1:cpu`, or `web`."""

    node: str | None
    tier: str
    index: int | None = None

    @classmethod
    def parse(cls, text: str, field: str = "device", default_node: str | None = None) -> Device:
        """Parse a device name; a bare tier (`gpu0`) takes `default_node` when one is given."""
        if not isinstance(text, str) or not text:
            raise InvalidRequest(f"{field}: a device name is required", {"field": field, "value": text})
        if text == "web":
            return cls(None, "web")
        parts = text.split(":")
        if len(parts) == 1 and default_node is not None:
            parts = [default_node, parts[0]]
        if len(parts) not in (2, 3):
            raise InvalidRequest(
                f"{field}: {text!r} is not a device name (expected <node>:<tier>[:<index>])",
                {"field": field, "value": text},
            )
        node = validate_node_name(parts[0], field)
        tier = parts[1]
        if not TIER_RE.match(tier):
            raise InvalidRequest(
                f"{field}: {text!r} has unknown tier {tier!r} (disk, dram, cpu or gpuN)",
                {"field": field, "value": text},
            )
        index: int | None = None
        if len(parts) == 3:
            if not parts[2].isdigit() or len(parts[2]) > 6:
                raise InvalidRequest(f"{field}: {text!r} has a bad index", {"field": field, "value": text})
            index = int(parts[2])
        return cls(node, tier, index)

    @property
    def is_gpu(self) -> bool:
        return self.tier.startswith("gpu")

    @property
    def gpu_index(self) -> int | None:
        return int(self.tier[3:]) if self.is_gpu else None

    @property
    def is_file_tier(self) -> bool:
        """A node's `disk` or `dram`: where files (model copies, chunks) live."""
        return self.node is not None and self.tier in FILE_TIERS and self.index is None

    @property
    def compute_device(self) -> str:
        """The name torch gives it: `cuda:N` or `cpu`."""
        return f"cuda:{self.gpu_index}" if self.is_gpu else "cpu"

    def on(self, node: str) -> Device:
        """The same tier on another node."""
        return Device(node, self.tier, self.index)

    def expect(self, field: str, *, files: bool = False, gpu: bool = False, cpu: bool = False) -> Device:
        """This device if it is of an allowed kind (a file tier, a GPU, the CPU), else InvalidRequest naming `field`."""
        if (files and self.is_file_tier) or (
            self.node is not None
            and self.index is None
            and ((gpu and self.is_gpu) or (cpu and self.tier == "cpu"))
        ):
            return self
        kinds = [k for k, on in (("disk", files), ("dram", files), ("gpuN", gpu), ("cpu", cpu)) if on]
        raise InvalidRequest(
            f"{field}: {self} is not a device of this kind (<node>:{'|'.join(kinds)})",
            {"field": field, "value": str(self), "allowed": kinds},
        )

    def __str__(self) -> str:
        if self.node is None:
            return self.tier
        base = f"{self.node}:{self.tier}"
        return base if self.index is None else f"{base}:{self.index}"


def safe_name(name: str, field: str = "name") -> str:
    """Return `name` if it can be one path component under a storage root, else raise."""
    if not isinstance(name, str) or not STORAGE_NAME_RE.match(name) or name in (".", "..") or ".." in name:
        raise InvalidRequest(
            f"{field}: {name!r} cannot be used as a storage name (letters, digits and ._@+=- only; no '..' or '/')",
            {"field": field, "value": name},
        )
    return name


def safe_relpath(rel: str, field: str = "path") -> tuple[str, ...]:
    """Split a manifest's relative file path (`1_Pooling/config.json`) into checked components."""
    if (
        not isinstance(rel, str)
        or not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or len(rel) > 1024
    ):
        raise InvalidRequest(f"{field}: {rel!r} is not a relative file path", {"field": field, "value": rel})
    parts = tuple(rel.split("/"))
    for part in parts:
        if part in ("", ".", "..") or len(part) > 255:
            raise InvalidRequest(
                f"{field}: {rel!r} is not a relative file path", {"field": field, "value": rel}
            )
    return parts


def file_path(root: str | Path, rel: str) -> Path:
    """A file inside `root` named by a relative path from a manifest; refuses anything that escapes."""
    base = Path(root).resolve()
    path = base.joinpath(*safe_relpath(rel))
    if base not in path.resolve().parents:
        raise InvalidRequest(f"path escapes its root: {rel!r}", {"root": str(base)})
    return path


def open_under(path: str | Path, roots: tuple[str, ...] | list[str], field: str = "source") -> BinaryIO:
    """`path` opened for reading, when the file that was opened lies under one of `roots`: the check is made on the
    open file itself (its path as the kernel knows it), so a symlink swapped in after an earlier check, or one
    inside an allowed directory that points out of it, reads nothing; links that stay inside (a Hugging Face cache's
    snapshots point at its blobs) are followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotFound(f"{field}: {path} does not exist on this node", {"field": field}) from None
    except OSError as exc:
        raise InvalidRequest(f"{field}: {path} cannot be opened: {exc.strerror}", {"field": field}) from None
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        bases = [Path(r).resolve() for r in roots]
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not any(b == real or b in real.parents for b in bases):
            raise InvalidRequest(f"{field}: {path} is not a file under an allowed root", {"field": field})
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def storage_path(root: str | Path, *names: str) -> Path:
    """Build a path under `root` from checked names; the only way a name reaches a file path."""
    base = Path(root).resolve()
    path = base
    for i, name in enumerate(names):
        path = path / safe_name(name, field=f"name[{i}]")
    resolved = path.resolve()
    if resolved != base and base not in resolved.parents:
        raise InvalidRequest(f"path escapes the storage root: {path}", {"root": str(base)})
    return path


@dataclass(frozen=True)
class Auto:
    """`auto` or `auto:<kind>` (gpu, cpu, dram, disk) where a device is asked for: placement chooses one."""

    kind: str | None = None

    def __str__(self) -> str:
        return AUTO if self.kind is None else f"{AUTO}:{self.kind}"


def parse_target(text: str | None, field: str, default_node: str | None = None) -> Device | Auto:
    """A device, or `auto` / `auto:<kind>` / nothing (placement chooses); anything else is refused naming `field`."""
    if text is None or text == AUTO:
        return Auto()
    if isinstance(text, str) and text.startswith(AUTO + ":"):
        kind = text.split(":", 1)[1]
        if kind not in AUTO_KINDS:
            raise InvalidRequest(
                f"{field}: {text!r}: auto takes one of {', '.join(AUTO_KINDS)} (auto:gpu, auto:dram, ...)",
                {"field": field, "value": text},
            )
        return Auto(kind)
    return Device.parse(text, field=field, default_node=default_node)
