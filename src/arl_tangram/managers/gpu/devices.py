"""Discovery of a node's accelerators and their NVLink domains.

Invariant: device indices are 0..n-1 and every device belongs to exactly one domain. CUDA
devices are used when present (``device="auto"``); otherwise the same manager runs on
CPU-backed devices, each with its own intra-op thread budget, so every code path is exercised.
"""

from __future__ import annotations

import torch

from ...core.errors import BrokenError
from .config import DeviceInfo, GpuManagerConfig


def resolve_kind(config: GpuManagerConfig) -> str:
    """ "cuda" or "cpu" for this config on this machine."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise BrokenError("GpuManagerConfig.device='cuda' but torch.cuda.is_available() is False")
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


def _peer_domains(n: int) -> tuple[tuple[int, ...], ...]:
    """Group CUDA devices by peer access (NVLink or P2P-capable PCIe): connected components."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if torch.cuda.can_device_access_peer(i, j):
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return tuple(tuple(g) for g in sorted(groups.values()))


def discover(config: GpuManagerConfig) -> tuple[list[DeviceInfo], tuple[tuple[int, ...], ...]]:
    """The node's devices and NVLink domains (config override first, then discovery)."""
    kind = resolve_kind(config)
    n = torch.cuda.device_count() if kind == "cuda" else config.cpu_devices
    if config.nvlink_domains is not None:
        domains = config.nvlink_domains
        bad = [d for dom in domains for d in dom if d >= n]
        if bad:
            raise ValueError(
                f"GpuManagerConfig.nvlink_domains names device {bad[0]} but the node has {n}"
            )
        listed = {d for dom in domains for d in dom}
        domains = domains + tuple((d,) for d in range(n) if d not in listed)
    elif kind == "cuda" and n > 1:
        domains = _peer_domains(n)
    else:
        domains = (tuple(range(n)),) if n else ()
    dom_of = {d: i for i, dom in enumerate(domains) for d in dom}
    devices = []
    for i in range(n):
        if kind == "cuda":
            props = torch.cuda.get_device_properties(i)
            devices.append(
                DeviceInfo(i, "cuda", props.total_memory / 2**20, dom_of[i], 0, props.name)
            )
        else:
            devices.append(
                DeviceInfo(
                    i,
                    "cpu",
                    config.cpu_device_memory_mb,
                    dom_of[i],
                    config.threads_per_device,
                    "cpu",
                )
            )
    return devices, domains


def torch_device(info: DeviceInfo) -> torch.device:
    return torch.device(f"cuda:{info.index}") if info.kind == "cuda" else torch.device("cpu")
