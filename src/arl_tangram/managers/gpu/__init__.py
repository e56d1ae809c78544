"""GPU resource manager: elastic reward-model serving on one node.

Loads reward models (scalar classifiers, embedding similarity, generative judges) onto the
node's accelerators -- CUDA devices when present, CPU-backed devices otherwise -- executes the
scheduler's LoadModel / UnloadModel / RunBatch commands, parks weights in host memory for fast
swap-in, batches concurrent requests, and measures the costs the core's cost model uses.
"""

from __future__ import annotations

from .config import BatchOutcome, DeviceInfo, GpuManagerConfig
from .costs import CostTracker, fit_alpha_beta
from .manager import GpuManager
from .testing import build_tiny_models, default_similarity_model_path, tiny_model_specs

__all__ = [
    "BatchOutcome",
    "CostTracker",
    "DeviceInfo",
    "GpuManager",
    "GpuManagerConfig",
    "build_tiny_models",
    "default_similarity_model_path",
    "fit_alpha_beta",
    "tiny_model_specs",
]
