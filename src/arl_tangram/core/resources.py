"""Resource vectors over named dimensions.

A `Resources` is an immutable mapping from a dimension name (``cpu``, ``memory_mb``, ``gpu``,
``gpu_memory_mb`` or any custom name) to a non-negative amount. Missing dimensions are zero.
Arithmetic returns new vectors; nothing here mutates. The core's hot loops use `fits_in` and
`__sub__`/`__add__`, so they stay dict-based and allocation-light.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView

CPU = "cpu"
MEMORY_MB = "memory_mb"
GPU = "gpu"
GPU_MEMORY_MB = "gpu_memory_mb"
STANDARD_DIMS = (CPU, MEMORY_MB, GPU, GPU_MEMORY_MB)

_EPS = 1e-9


def _canonical(d: Mapping[str, float]) -> dict[str, float]:
    """``d``'s amounts rounded to 9 decimals, those of at most 1e-9 left out (a missing
    dimension is zero; `__sub__` drops such noise too): what `Resources` compares and hashes."""
    out: dict[str, float] = {}
    for k, v in d.items():
        v = float(v)
        if v > _EPS:
            out[k] = round(v, 9)
    return out


class Resources(Mapping[str, float]):
    """An immutable resource vector. ``Resources(cpu=2, memory_mb=512)``."""

    # ``_h``: its hash once asked (-1: not yet; no hash is -1), kept because a vector is a dict
    # key of the scheduler's hot path (a session's shape) and its hash is not cheap (`__hash__`).
    # Never pickled (`__getstate__`): a string's hash differs from one process to another.
    __slots__ = ("_d", "_h")

    def __init__(self, values: Mapping[str, float] | None = None, /, **kw: float) -> None:
        d: dict[str, float] = {}
        for src in (values or {}), kw:
            for k, v in src.items():
                v = float(v)
                if v < 0 or v != v:
                    raise ValueError(f"resource {k!r} must be a non-negative number, got {v!r}")
                if v:
                    d[k] = d.get(k, 0.0) + v
        self._d = d
        self._h = -1

    @classmethod
    def _raw(cls, d: dict[str, float]) -> Resources:
        r = cls.__new__(cls)
        r._d = d
        r._h = -1
        return r

    def __getstate__(self) -> dict[str, float]:
        return self._d

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple):  # (pickled before 2026-12-01: its slots' state)
            state = state[1]["_d"]
        assert isinstance(state, dict)
        self._d = state
        self._h = -1

    # Mapping protocol -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> float:
        return self._d.get(key, 0.0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def get(self, key: str, default: float = 0.0) -> float:  # type: ignore[override]
        return self._d.get(key, default)

    def __contains__(self, key: object) -> bool:
        """A dimension with an amount (zeros are not kept). (`Mapping`'s would ask
        `__getitem__`, which answers 0.0 for any dimension: every key would be in.)"""
        return key in self._d

    # the dict's own views: the same pairs in the same order as `Mapping`'s, without a
    # `__getitem__` per key (the scheduler iterates demands and allotments on its hot path)
    def keys(self) -> KeysView[str]:
        return self._d.keys()

    def values(self) -> ValuesView[float]:
        return self._d.values()

    def items(self) -> ItemsView[str, float]:
        return self._d.items()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v:g}" for k, v in sorted(self._d.items()))
        return f"Resources({inner})"

    def __eq__(self, other: object) -> bool:
        """Equal where every amount above 1e-9 is, rounded to 9 decimals (`_canonical`): an
        equivalence, so equal vectors hash alike (a tolerance, |a - b| <= 1e-9, is not one:
        1.0000000004 and 1.0000000006 were equal and hashed apart, and a Resources is a dict
        key and set member inside `Sessions`' shapes)."""
        if not isinstance(other, Mapping):
            return NotImplemented
        return _canonical(self._d) == _canonical(other)

    def __hash__(self) -> int:
        h = self._h
        if h == -1:
            h = self._h = hash(tuple(sorted(_canonical(self._d).items())))
        return h

    # Arithmetic --------------------------------------------------------------------------------
    def __add__(self, other: Mapping[str, float]) -> Resources:
        d = dict(self._d)
        for k, v in other.items():
            d[k] = d.get(k, 0.0) + v
        return Resources._raw(d)

    def __sub__(self, other: Mapping[str, float]) -> Resources:
        """Difference, clamped at zero (tiny negative float noise is dropped)."""
        d = dict(self._d)
        for k, v in other.items():
            nv = d.get(k, 0.0) - v
            if nv > _EPS:
                d[k] = nv
            else:
                d.pop(k, None)
        return Resources._raw(d)

    def scaled(self, factor: float) -> Resources:
        return Resources._raw({k: v * factor for k, v in self._d.items() if v * factor > 0})

    def with_amount(self, dim: str, amount: float) -> Resources:
        d = dict(self._d)
        if amount > 0:
            d[dim] = float(amount)
        else:
            d.pop(dim, None)
        return Resources._raw(d)

    def fits_in(self, capacity: Mapping[str, float]) -> bool:
        """True when every dimension of self is <= the same dimension of ``capacity``."""
        get = capacity.get
        for k, v in self._d.items():  # noqa: SIM110 - hot path, a plain loop is faster than all()
            if v > get(k, 0.0) + _EPS:
                return False
        return True

    def shortfall(self, capacity: Mapping[str, float]) -> dict[str, float]:
        """The dimensions (and amounts) by which self exceeds ``capacity``."""
        return {
            k: v - capacity.get(k, 0.0)
            for k, v in self._d.items()
            if v > capacity.get(k, 0.0) + _EPS
        }

    def dominant_share(self, capacity: Mapping[str, float]) -> float:
        """Largest fraction of ``capacity`` this vector takes in any dimension (DRF style)."""
        share = 0.0
        for k, v in self._d.items():
            cap = capacity.get(k, 0.0)
            s = v / cap if cap > 0 else float("inf")
            if s > share:
                share = s
        return share

    def as_dict(self) -> dict[str, float]:
        return dict(self._d)

    def is_zero(self) -> bool:
        return not self._d


def total(vectors: Iterable[Mapping[str, float]]) -> Resources:
    d: dict[str, float] = {}
    for r in vectors:
        for k, v in r.items():
            d[k] = d.get(k, 0.0) + v
    return Resources(d)


ZERO = Resources()
