"""Configuration and boundary records of the GPU manager.

Invariant: everything that crosses the manager's boundary is a frozen, slotted dataclass; the
config is validated once, here, and every error names the field and the value it got.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...kinds import Outcome

_DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuManagerConfig:
    """How one node's GPU manager finds its devices and serves models."""

    device: str = "auto"
    """"auto" (CUDA when torch.cuda.is_available(), else CPU-backed devices), "cuda" or "cpu"."""
    cpu_devices: int = 2
    """Number of CPU-backed devices when running without CUDA."""
    threads_per_device: int = 1
    """Intra-op threads a CPU-backed device may use (an instance on k devices gets k times that)."""
    cpu_device_memory_mb: float = 4096.0
    """Memory a CPU-backed device reports (its share of host RAM for accounting)."""
    nvlink_domains: tuple[tuple[int, ...], ...] | None = None
    """NVLink domains as device-index tuples; None: discover (CUDA peer access) or one domain."""
    host_park_limit_mb: float = 16384.0
    """Host memory parked (swapped-out) weights may take; the least recently parked go first."""
    max_batch_tokens: int = 16384
    """Padded tokens per forward pass; a batch is split into length-grouped micro-batches."""
    max_length: int = 512
    """Inputs are truncated to this many tokens."""
    batch_wait_ms: float = 5.0
    """How long the dynamic batcher waits for more actions after the first one arrives."""
    pin_host_memory: bool = True
    """Pin parked weights (CUDA only) so swap-in is an asynchronous DMA copy."""
    forward_timeout_s: float = 60.0
    """Deadline of one batch's forward pass in an instance's process; past it the process is
    killed and the instance replaced. A model's ``options["forward_timeout_s"]`` overrides it."""

    def __post_init__(self) -> None:
        if self.device not in _DEVICES:
            raise ValueError(
                f"GpuManagerConfig.device must be one of {_DEVICES}, got {self.device!r}"
            )
        for name in ("cpu_devices", "threads_per_device", "max_batch_tokens", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GpuManagerConfig.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.forward_timeout_s, int | float) or not self.forward_timeout_s > 0:
            raise ValueError(
                f"GpuManagerConfig.forward_timeout_s must be a number > 0, "
                f"got {self.forward_timeout_s!r}"
            )
        for name in ("cpu_device_memory_mb", "host_park_limit_mb", "batch_wait_ms"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"GpuManagerConfig.{name} must be a number >= 0, got {value!r}")
        if self.nvlink_domains is not None:
            doms = tuple(tuple(int(d) for d in dom) for dom in self.nvlink_domains)
            flat = [d for dom in doms for d in dom]
            if len(flat) != len(set(flat)) or any(d < 0 for d in flat):
                raise ValueError(
                    f"GpuManagerConfig.nvlink_domains must list each device index >= 0 once, "
                    f"got {self.nvlink_domains!r}"
                )
            object.__setattr__(self, "nvlink_domains", doms)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One accelerator (or CPU-backed stand-in) of the node."""

    index: int  # device index on the node (what LoadModel.devices names)
    kind: str  # "cuda" or "cpu"
    memory_mb: float  # total device memory (for CPU-backed devices: the configured share)
    domain: int  # index of its NVLink domain in nvlink_domains()
    threads: int = 0  # intra-op thread budget (CPU-backed devices); 0 for CUDA
    name: str = ""  # e.g. "NVIDIA H100 80GB HBM3" or "cpu"


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What a RunBatch produced: per-action outputs or reasons, and the measured latency."""

    outputs: Mapping[str, Outcome] = field(default_factory=dict)  # action id -> its outcome
    failed: Mapping[str, str] = field(default_factory=dict)  # action id -> reason
    latency_s: float = 0.0  # measured compute time of the batch (queueing excluded)
    batch_size: int = 0  # number of actions that were scored
