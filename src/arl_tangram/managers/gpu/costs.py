"""Measured costs of one model: batch latency curve, cold load and swap-in times.

Invariant: every figure here was measured on this node (or is the spec's prior, flagged as such
by a zero sample count). The batch curve ``latency = alpha + beta * batch`` is an ordinary least
squares fit over the recent samples (the median latency of each batch size, so sizes weigh
equally), with both coefficients kept >= 0;
it replaces the spec's prior once samples cover `CostTracker.MIN_SIZES` distinct batch sizes
(two nearby sizes make a fit that noise can tip either way).
"""

from __future__ import annotations

from collections import deque
from statistics import median

from ...core.cluster import ModelSpec


def fit_alpha_beta(
    samples: list[tuple[int, float]], min_sizes: int = 2
) -> tuple[float, float] | None:
    """Least squares ``latency = alpha + beta * n``; None with fewer than ``min_sizes`` sizes."""
    by_size: dict[int, list[float]] = {}
    for n, y in samples:
        by_size.setdefault(n, []).append(y)
    if len(by_size) < max(2, min_sizes):
        return None
    # one point per size (its median): many samples at one size must not outweigh the rest
    samples = [(n, median(ys)) for n, ys in sorted(by_size.items())]
    k = len(samples)
    mx = sum(n for n, _ in samples) / k
    my = sum(y for _, y in samples) / k
    sxx = sum((n - mx) ** 2 for n, _ in samples)
    sxy = sum((n - mx) * (y - my) for n, y in samples)
    beta = max(0.0, sxy / sxx)
    alpha = my - beta * mx
    if alpha < 0:  # refit through the origin
        alpha = 0.0
        beta = sum(n * y for n, y in samples) / sum(n * n for n, _ in samples)
    return alpha, beta


class CostTracker:
    """Recent measurements of one model, and the fitted figures the core's cost model wants."""

    MIN_SIZES = 3  # distinct batch sizes before the fit replaces the spec's prior

    def __init__(self, spec: ModelSpec, window: int = 256) -> None:
        self.spec = spec
        self.batches: deque[tuple[int, float]] = deque(maxlen=window)
        self.loads: deque[float] = deque(maxlen=window)
        self.swaps: deque[float] = deque(maxlen=window)

    def add_batch(self, n: int, latency_s: float) -> None:
        if n > 0:
            self.batches.append((n, latency_s))

    def add_load(self, seconds: float, from_host: bool) -> None:
        (self.swaps if from_host else self.loads).append(seconds)

    def fitted(self) -> dict[str, float | int | bool]:
        fit = fit_alpha_beta(list(self.batches), self.MIN_SIZES)
        alpha, beta = fit if fit is not None else (self.spec.alpha, self.spec.beta)
        return {
            "alpha": alpha,
            "beta": beta,
            "fitted": fit is not None,
            "batch_samples": len(self.batches),
            "load_s": median(self.loads) if self.loads else self.spec.load_s,
            "load_samples": len(self.loads),
            "swap_s": median(self.swaps) if self.swaps else self.spec.swap_s,
            "swap_samples": len(self.swaps),
        }

    def knee_batch(self) -> int:
        """Batch size at the knee of the fitted curve (80% of peak throughput), capped."""
        f = self.fitted()
        alpha, beta = float(f["alpha"]), float(f["beta"])
        if beta <= 0:
            return self.spec.max_batch
        return max(1, min(self.spec.max_batch, round(4 * alpha / beta)))
