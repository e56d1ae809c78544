"""Measured costs of one model: batch latency curve, cold load and swap-in times.

Invariant: every figure here was measured on this node (or is the spec's prior, flagged as such
by a zero sample count). The batch curve ``latency = alpha + beta * batch`` is an ordinary least
squares fit over the recent samples (the median latency of each batch size, weighted for
relative error), with both coefficients kept >= 0;
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
    """Fit ``latency = alpha + beta * n``; None with fewer than ``min_sizes`` distinct sizes.

    One point per batch size (its median), so many samples at one size do not outweigh the
    rest; weighted by ``1 / latency**2`` (relative error), because timing noise scales with the
    latency -- unweighted, the noise of the largest batches swamps the intercept ``alpha``.
    """
    by_size: dict[int, list[float]] = {}
    for n, y in samples:
        by_size.setdefault(n, []).append(y)
    if len(by_size) < max(2, min_sizes):
        return None
    pts = [(float(n), max(median(ys), 1e-9)) for n, ys in sorted(by_size.items())]
    w = [1.0 / (y * y) for _, y in pts]
    sw = sum(w)
    sx = sum(wi * n for wi, (n, _) in zip(w, pts, strict=True))
    sy = sum(wi * y for wi, (_, y) in zip(w, pts, strict=True))
    sxx = sum(wi * n * n for wi, (n, _) in zip(w, pts, strict=True))
    sxy = sum(wi * n * y for wi, (n, y) in zip(w, pts, strict=True))
    beta = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    if beta <= 0:  # latency does not grow with the batch: a flat line at the mean
        return sum(y for _, y in pts) / len(pts), 0.0
    alpha = (sy - beta * sx) / sw
    if alpha < 0:  # refit through the origin (same weights)
        return 0.0, sxy / sxx
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
