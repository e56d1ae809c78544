"""GPU resource manager: elastic reward-model serving on one node.

Loads reward models (scalar classifiers, embedding similarity, generative judges) onto the
node's accelerators -- CUDA devices when present, CPU-backed devices otherwise -- executes the
scheduler's LoadModel / UnloadModel / RunBatch commands, parks weights in host memory for fast
swap-in, batches concurrent requests, and measures the costs the core's cost model uses.

Invariant: importing this package imports nothing else of it; the public names load on first use.
So `config.py` (`GpuManagerConfig`, which the service config builds when its YAML is parsed)
imports without the ``[gpu]`` extra (torch); `GpuManager` needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_face

if TYPE_CHECKING:
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
_WHERE = {"BatchOutcome": "config", "DeviceInfo": "config", "GpuManagerConfig": "config",
          "CostTracker": "costs", "fit_alpha_beta": "costs", "GpuManager": "manager",
          "build_tiny_models": "testing", "default_similarity_model_path": "testing",
          "tiny_model_specs": "testing"}

__getattr__, __dir__ = lazy_face(__name__, _WHERE, __all__)
