"""Prometheus text of the newest frames: GPU gauges with the names, units and labels of NVIDIA's DCGM exporter, so
its Grafana dashboard works unchanged, and host gauges of gswarm's own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FRAME_INTERVAL_S = 1.0  # a node sends a frame a second without a faster session: a cached body is never older

# NVIDIA's DCGM exporter names and units, so its Grafana dashboards work unchanged (FB in MiB, power in W).
DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.get("utilization_percent")),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        lambda g: g["memory_used_bytes"] / 2**20 if g.get("memory_used_bytes") is not None else None,
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda g: (
            (g["memory_total_bytes"] - g["memory_used_bytes"]) / 2**20
            if g.get("memory_total_bytes") is not None and g.get("memory_used_bytes") is not None
            else None
        ),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.get("temperature_c")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.get("power_w")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.get("sm_clock_mhz")),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.get("memory_clock_mhz")),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus (in bytes/s).",
        lambda g: g.get("pcie_rx_bytes_per_s"),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus (in bytes/s).",
        lambda g: g.get("pcie_tx_bytes_per_s"),
    ),
)
HOST = (
    ("gswarm_host_cpu_percent", "Host CPU utilization (in %).", "cpu_percent"),
    ("gswarm_host_dram_used_bytes", "Host memory used (in bytes).", "dram_used_bytes"),
    ("gswarm_host_dram_percent", "Host memory used (in %).", "dram_percent"),
    ("gswarm_host_disk_read_bytes_per_second", "Disk read throughput.", "disk_read_bytes_per_s"),
    ("gswarm_host_disk_write_bytes_per_second", "Disk write throughput.", "disk_write_bytes_per_s"),
    ("gswarm_host_network_receive_bytes_per_second", "Network receive throughput.", "net_rx_bytes_per_s"),
    ("gswarm_host_network_transmit_bytes_per_second", "Network transmit throughput.", "net_tx_bytes_per_s"),
)


def _label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gpu_labels(node: str, g: dict[str, Any]) -> str:
    """The labels NVIDIA's DCGM exporter gives a GPU (gpu, UUID, pci_bus_id, device, modelName, hostname), and
    `instance` = the node, so a scrape with `honor_labels: true` sees one instance per node as it would with
    one exporter per host."""
    labels = [("gpu", g.get("index")), ("UUID", g.get("uuid"))]
    if g.get("pci_bus_id"):
        labels.append(("pci_bus_id", g["pci_bus_id"]))
    labels += [("device", f"nvidia{g.get('index')}"), ("modelName", g.get("name")), ("hostname", node)]
    labels.append(("instance", node))
    return ",".join(f'{k}="{_label(v)}"' for k, v in labels)


def _node_labels(node: str) -> str:
    return f'hostname="{_label(node)}",instance="{_label(node)}"'


@dataclass
class NodeText:
    """One node's lines of every family (each line ending in a newline), made from one frame."""

    gpu: list[str]  # per DCGM family
    host: list[str]  # per HOST family
    time: float  # the frame's, for gswarm_frame_age_seconds


def node_text(node: str, frame: dict[str, Any]) -> NodeText:
    """A node's lines: its GPUs' labels are made once for every family (8 GPUs x 9 families shared 8 label sets)."""
    gpu = [[] for _ in DCGM]  # type: list[list[str]]
    for g in frame.get("gpus") or []:
        labels = _gpu_labels(node, g)
        for out, (name, _, get) in zip(gpu, DCGM, strict=True):
            value = get(g)
            if value is not None:
                out.append(f"{name}{{{labels}}} {float(value)}\n")
    host = frame.get("host") or {}
    node_labels = _node_labels(node)
    host_lines = []
    for name, _, key in HOST:
        value = host.get(key)
        host_lines.append(
            f"{name}{{{node_labels}}} {float(value)}\n" if isinstance(value, int | float) else ""
        )
    return NodeText(["".join(lines) for lines in gpu], host_lines, float(frame["time"]))


def _headers(name: str, help_: str) -> str:
    return f"# HELP {name} {help_}\n# TYPE {name} gauge\n"


def render(texts: list[tuple[str, NodeText]], now: float) -> str:
    """The exposition from every node's lines, nodes in name order (`texts` sorted by node)."""
    parts: list[str] = []
    for i, (name, help_, _) in enumerate(DCGM):
        parts.append(_headers(name, help_))
        parts += [t.gpu[i] for _, t in texts]
    for i, (name, help_, _) in enumerate(HOST):
        parts.append(_headers(name, help_))
        parts += [t.host[i] for _, t in texts]
    parts.append(_headers("gswarm_frame_age_seconds", "Seconds since the node's newest frame."))
    parts += [f"gswarm_frame_age_seconds{{{_node_labels(n)}}} {round(now - t.time, 3)}\n" for n, t in texts]
    return "".join(parts)


def prometheus_text(latest: dict[str, dict[str, Any]]) -> str:
    """The exposition of every node's newest frame."""
    return render([(n, node_text(n, f)) for n, f in sorted(latest.items())], time.time())


class MetricsCache:
    """`/metrics` of the newest frames for one web process: each node's lines are kept with the frame (as stored,
    bytes) they came from and made again only when that frame changes, and the whole body is read from Redis at most
    once per `interval_s` (the frame period): scrapes within it share one read. The frame ages are computed at
    every answer, so a cached answer still tells how old each frame is."""

    def __init__(self, interval_s: float = FRAME_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[bytes, NodeText]] = {}
        self._texts: list[tuple[str, NodeText]] = []
        self._read_at = -float("inf")

    def text(self, read: Callable[[], dict[bytes, bytes]]) -> str:
        """The exposition; `read` answers the stored frames (node -> JSON bytes), called at most once per interval."""
        with self._lock:
            if time.monotonic() - self._read_at >= self.interval_s:
                self._texts = self._refresh(read())
                self._read_at = time.monotonic()
            texts = self._texts
        return render(texts, time.time())

    def _refresh(self, raw: dict[bytes, bytes]) -> list[tuple[str, NodeText]]:
        nodes: dict[str, tuple[bytes, NodeText]] = {}
        for key, body in raw.items():
            node = key.decode()
            kept = self._nodes.get(node)
            nodes[node] = (
                kept if kept is not None and kept[0] == body else (body, node_text(node, json.loads(body)))
            )
        self._nodes = nodes
        return [(n, nodes[n][1]) for n in sorted(nodes)]


def latest_json(raw: dict[bytes, bytes], now: float) -> bytes:
    """`GET /metrics/latest`'s body, `{"nodes": {node: frame + age_s}}` by node name, from the frames as stored: each
    frame is parsed for its time but not encoded again (its text is kept, `age_s` added before its closing brace),
    which halves the CPU of an answer of 1,000 frames."""
    parts = []
    for key in sorted(raw):
        body = raw[key].rstrip()
        frame = json.loads(body)
        age = round(now - float(frame["time"]), 3)
        if isinstance(frame, dict) and len(frame) > 0 and "age_s" not in frame and body.endswith(b"}"):
            text = body[:-1] + b', "age_s": ' + json.dumps(age).encode() + b"}"
        else:
            text = json.dumps({**frame, "age_s": age}).encode()
        parts.append(json.dumps(key.decode()).encode() + b": " + text)
    return b'{"nodes": {' + b", ".join(parts) + b"}}"
