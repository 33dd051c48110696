"""Prometheus text of the newest frames: GPU gauges with the names, units and labels of NVIDIA's DCGM exporter, so
its Grafana dashboard works unchanged, and host gauges of gswarm's own."""

from __future__ import annotations

import time
from typing import Any

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


def prometheus_text(latest: dict[str, dict[str, Any]]) -> str:
    lines: list[str] = []
    for name, help_, get in DCGM:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for node, f in sorted(latest.items()):
            for g in f.get("gpus") or []:
                value = get(g)
                if value is not None:
                    lines.append(f"{name}{{{_gpu_labels(node, g)}}} {float(value)}")
    for name, help_, key in HOST:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for node, f in sorted(latest.items()):
            value = (f.get("host") or {}).get(key)
            if isinstance(value, int | float):
                lines.append(f"{name}{{{_node_labels(node)}}} {float(value)}")
    lines += [
        "# HELP gswarm_frame_age_seconds Seconds since the node's newest frame.",
        "# TYPE gswarm_frame_age_seconds gauge",
    ]
    now = time.time()
    for node, f in sorted(latest.items()):
        lines.append(f"gswarm_frame_age_seconds{{{_node_labels(node)}}} {round(now - float(f['time']), 3)}")
    return "\n".join(lines) + "\n"
