"""core/resources.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
dimension names, a vector's construction (amounts summed over the mapping and the keywords, a
zero dropped, a negative or NaN refused with its message), missing dimensions read as 0.0, the
text of a vector, equality within 1e-9 over both vectors' dimensions, the hash of the amounts
rounded to 9 places, the arithmetic (a difference at or under 1e-9 dropped, a scaling to 0
dropped, an amount set or removed), the fit, shortfall and dominant share with the 1e-9
tolerance, and `total`."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arl_tangram.core import resources
from arl_tangram.core.resources import (
    CPU,
    GPU,
    GPU_MEMORY_MB,
    MEMORY_MB,
    STANDARD_DIMS,
    ZERO,
    Resources,
    total,
)

# ---- names ----------------------------------------------------------------------------------


def test_the_dimension_names() -> None:
    assert (CPU, MEMORY_MB, GPU, GPU_MEMORY_MB) == ("cpu", "memory_mb", "gpu", "gpu_memory_mb")
    assert STANDARD_DIMS == ("cpu", "memory_mb", "gpu", "gpu_memory_mb")
    assert resources._EPS == 1e-9
    assert type(ZERO) is Resources and ZERO.as_dict() == {} and len(ZERO) == 0


# ---- construction ---------------------------------------------------------------------------


def test_amounts_are_floats_summed_over_the_mapping_and_the_keywords() -> None:
    r = Resources({"cpu": 1, "gpu": 2}, cpu=2, memory_mb=512)
    assert r.as_dict() == {"cpu": 3.0, "gpu": 2.0, "memory_mb": 512.0}
    assert all(type(v) is float for v in r.as_dict().values())
    assert Resources(cpu=2).as_dict() == {"cpu": 2.0}
    assert Resources({"gpu": 1}).as_dict() == {"gpu": 1.0}
    assert Resources(None).as_dict() == {}
    assert Resources().as_dict() == {}


def test_a_zero_amount_is_dropped_and_a_fraction_kept() -> None:
    assert Resources(cpu=0, gpu=0.0).as_dict() == {}
    assert Resources(cpu=0.5, gpu=0).as_dict() == {"cpu": 0.5}
    assert Resources(cpu=0).is_zero() is True
    assert Resources(cpu=0.5).is_zero() is False


@pytest.mark.parametrize(("amount", "text"), [(-1, "-1.0"), (-1e-12, "-1e-12"), (math.nan, "nan")])
def test_a_negative_or_nan_amount_is_refused(amount: float, text: str) -> None:
    with pytest.raises(ValueError) as e:
        Resources(cpu=amount)
    assert str(e.value) == f"resource 'cpu' must be a non-negative number, got {text}"
    with pytest.raises(ValueError) as e:
        Resources({"gpu": amount})
    assert str(e.value) == f"resource 'gpu' must be a non-negative number, got {text}"


# ---- reading --------------------------------------------------------------------------------


def test_a_missing_dimension_reads_as_zero() -> None:
    r = Resources(cpu=2)
    assert r["cpu"] == 2.0
    m = r["gpu"]
    assert m == 0.0 and type(m) is float
    g = r.get("gpu")
    assert g == 0.0 and type(g) is float
    assert r.get("gpu", 5.0) == 5.0
    assert r.get("cpu", 5.0) == 2.0
    assert list(r) == ["cpu"] and len(r) == 1
    assert len(Resources(cpu=1, gpu=1)) == 2


def test_the_text_of_a_vector_is_its_sorted_amounts() -> None:
    assert repr(Resources(memory_mb=512, cpu=2.5)) == "Resources(cpu=2.5, memory_mb=512)"
    assert repr(Resources()) == "Resources()"
    assert repr(Resources(gpu=1e-12)) == "Resources(gpu=1e-12)"


# ---- equality and hash ----------------------------------------------------------------------


def test_equality_is_of_amounts_above_1e_9_rounded_to_9_places() -> None:
    assert Resources(cpu=1.0000000004) == {"cpu": 1.0}
    assert Resources(cpu=1.0000000006) != {"cpu": 1.0}
    assert Resources(cpu=1e-9) == {}
    assert Resources() == {"cpu": 1e-9}
    assert Resources(cpu=2e-9) != {}
    assert Resources(cpu=1) == {"cpu": 1.0}
    assert Resources(cpu=1) == Resources(cpu=1, gpu=1e-10)
    assert Resources(cpu=1) != {"cpu": 1.0, "gpu": 1.0}
    assert Resources(cpu=1, gpu=1) != {"cpu": 1.0}
    assert Resources() != {"gpu": 1.0}
    assert Resources(gpu=1) != {}
    assert Resources(cpu=1) != {"cpu": 2.0}
    assert Resources(cpu=3) != {"cpu": 1.0}


def test_equality_with_a_non_mapping_is_not_implemented() -> None:
    assert Resources(cpu=1).__eq__(1.0) is NotImplemented
    assert Resources(cpu=1).__eq__({"cpu": 1}) is True
    assert Resources(cpu=1).__eq__({"cpu": 2}) is False


def test_the_hash_is_of_the_sorted_amounts_rounded_to_9_places() -> None:
    assert hash(Resources(memory_mb=2, cpu=1.5)) == hash((("cpu", 1.5), ("memory_mb", 2.0)))
    assert hash(Resources(cpu=1.0000000004)) == hash((("cpu", 1.0),))
    assert hash(Resources(cpu=1.0000000006)) == hash((("cpu", 1.000000001),))
    assert hash(Resources()) == hash(())


# ---- arithmetic -----------------------------------------------------------------------------


def test_a_sum_adds_each_dimension() -> None:
    s = Resources(cpu=1, gpu=1) + {"cpu": 2.0, "memory_mb": 5.0}
    assert type(s) is Resources
    assert s.as_dict() == {"cpu": 3.0, "gpu": 1.0, "memory_mb": 5.0}
    assert (Resources() + Resources(cpu=0.5)).as_dict() == {"cpu": 0.5}


def test_a_difference_drops_what_is_at_or_under_1e_9() -> None:
    d = Resources(cpu=3, gpu=1, memory_mb=5) - {"cpu": 1.0, "gpu": 1.0}
    assert type(d) is Resources
    assert d.as_dict() == {"cpu": 2.0, "memory_mb": 5.0}
    assert (Resources(cpu=2e-9) - {"cpu": 1e-9}).as_dict() == {}
    assert (Resources(cpu=3e-9) - {"cpu": 1e-9}).as_dict() == {"cpu": 3e-9 - 1e-9}
    assert (Resources(cpu=1) - {"cpu": 2.0}).as_dict() == {}
    assert (Resources(cpu=1) - {"gpu": 1.0}).as_dict() == {"cpu": 1.0}
    assert (Resources(cpu=1) - {"cpu": 0.5}).as_dict() == {"cpu": 0.5}
    assert (Resources() - {"cpu": -2.0}).as_dict() == {"cpu": 2.0}
    assert (Resources() - {"cpu": -0.5}).as_dict() == {"cpu": 0.5}


def test_scaling_drops_what_is_scaled_to_zero() -> None:
    r = Resources(cpu=2, memory_mb=100)
    assert r.scaled(0.25).as_dict() == {"cpu": 0.5, "memory_mb": 25.0}
    assert r.scaled(3).as_dict() == {"cpu": 6.0, "memory_mb": 300.0}
    assert r.scaled(0).as_dict() == {}
    assert type(r.scaled(0.25)) is Resources


def test_an_amount_set_or_removed() -> None:
    r = Resources(cpu=2, gpu=1)
    s = r.with_amount("cpu", 3)
    assert s.as_dict() == {"cpu": 3.0, "gpu": 1.0} and type(s["cpu"]) is float
    assert type(s) is Resources
    assert r.with_amount("memory_mb", 0.5).as_dict() == {"cpu": 2.0, "gpu": 1.0, "memory_mb": 0.5}
    assert r.with_amount("cpu", 0).as_dict() == {"gpu": 1.0}
    assert r.with_amount("memory_mb", 0).as_dict() == {"cpu": 2.0, "gpu": 1.0}
    assert r.as_dict() == {"cpu": 2.0, "gpu": 1.0}


# ---- fit, shortfall, share ------------------------------------------------------------------


def test_fits_in_with_the_1e_9_tolerance() -> None:
    assert Resources(cpu=1).fits_in({"cpu": 1.0}) is True
    assert Resources(cpu=1 + 1e-9).fits_in({"cpu": 1.0}) is True
    assert Resources(cpu=1 + 3e-9).fits_in({"cpu": 1.0}) is False
    assert Resources(cpu=1e-9).fits_in({}) is True
    assert Resources(cpu=0.5).fits_in({}) is False
    assert Resources(cpu=1, gpu=1).fits_in({"cpu": 4.0}) is False
    assert Resources(cpu=1, gpu=1).fits_in({"cpu": 4.0, "gpu": 1.0}) is True
    assert Resources().fits_in({}) is True


def test_the_shortfall_names_each_dimension_over_and_by_how_much() -> None:
    r = Resources(cpu=3, gpu=1, memory_mb=100)
    assert r.shortfall({"cpu": 2.0, "memory_mb": 200.0}) == {"cpu": 1.0, "gpu": 1.0}
    assert r.shortfall({"cpu": 3.0, "gpu": 1.0, "memory_mb": 100.0}) == {}
    assert Resources(cpu=1 + 1e-9).shortfall({"cpu": 1.0}) == {}
    assert Resources(cpu=0.5).shortfall({}) == {"cpu": 0.5}
    assert Resources(cpu=1e-9).shortfall({}) == {}


def test_the_dominant_share_is_the_largest_fraction() -> None:
    r = Resources(cpu=2, memory_mb=100)
    assert r.dominant_share({"cpu": 8.0, "memory_mb": 200.0}) == 0.5
    assert r.dominant_share({"cpu": 4.0, "memory_mb": 400.0}) == 0.5
    assert Resources(cpu=1).dominant_share({"cpu": 4.0}) == 0.25
    assert Resources(cpu=1).dominant_share({"cpu": 0.5}) == 2.0
    assert Resources(cpu=1).dominant_share({}) == math.inf
    assert Resources(cpu=1).dominant_share({"cpu": 0.0}) == math.inf
    assert Resources().dominant_share({"cpu": 4.0}) == 0.0


def test_as_dict_is_a_copy() -> None:
    r = Resources(cpu=1)
    d = r.as_dict()
    d["cpu"] = 5.0
    assert r.as_dict() == {"cpu": 1.0}


def test_total_sums_the_vectors() -> None:
    t = total([Resources(cpu=1, gpu=1), {"cpu": 2.0, "memory_mb": 4.0}, Resources(cpu=0.5)])
    assert type(t) is Resources
    assert t.as_dict() == {"cpu": 3.5, "gpu": 1.0, "memory_mb": 4.0}
    assert total([]).as_dict() == {}
    assert total([{"cpu": 0.25}]).as_dict() == {"cpu": 0.25}


def test_equal_vectors_hash_alike() -> None:
    """Equality is on amounts rounded to 9 decimals (an equivalence), so equal vectors hash
    alike: the rule a dict or set of shapes relies on (`Sessions._groups`)."""
    a, b = Resources(cpu=1.0000000004), Resources(cpu=1.0)
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    # a dimension that rounds to zero is a missing one
    assert Resources(cpu=2.0, gpu=1e-12) == Resources(cpu=2.0)
    assert hash(Resources(cpu=2.0, gpu=1e-12)) == hash(Resources(cpu=2.0))
    assert Resources(gpu=1e-12) == {}
    assert Resources(gpu=1.5e-9) != {}
    # either side of a rounding step: not equal (a tolerance would chain 1.0 to 2.0)
    assert Resources(cpu=1.0000000004) != Resources(cpu=1.0000000006)
    assert Resources(cpu=1.0) != Resources(cpu=1.000000001)
    assert Resources(cpu=1.0) == {"cpu": 1}
    assert Resources(cpu=1.0) != {"cpu": 1, "gpu": 0.5}
    assert Resources(cpu=1.0).__eq__(3) is NotImplemented


@given(st.floats(0, 1e6), st.floats(-2e-9, 2e-9))
def test_equal_implies_same_hash(x: float, d: float) -> None:
    a, b = Resources(cpu=x), Resources(cpu=max(0.0, x + d))
    if a == b:
        assert hash(a) == hash(b)


# ---- membership, views, the kept hash, pickling -------------------------------------------------


def test_a_dimension_is_in_a_vector_only_with_an_amount() -> None:
    r = Resources(cpu=2, gpu=0)
    assert ("cpu" in r, "gpu" in r, "memory_mb" in r, 3 in r) == (True, False, False, False)
    assert r["gpu"] == 0.0  # (read as zero all the same)


def test_the_views_are_the_amounts_in_order() -> None:
    r = Resources({"memory_mb": 512}, cpu=2)
    assert list(r.keys()) == ["memory_mb", "cpu"]
    assert list(r.values()) == [512.0, 2.0]
    assert list(r.items()) == [("memory_mb", 512.0), ("cpu", 2.0)]
    assert dict(r) == {"memory_mb": 512.0, "cpu": 2.0}


def test_the_hash_is_kept_once_asked_and_never_pickled() -> None:
    import pickle

    r = Resources(cpu=1.5, memory_mb=256)
    assert r._h == -1
    h = hash(r)
    assert r._h == h == hash((("cpu", 1.5), ("memory_mb", 256.0)))
    back = pickle.loads(pickle.dumps(r))
    assert (back._h, back._d, back == r, hash(back) == h) == (-1, {"cpu": 1.5, "memory_mb": 256.0}, True, True)
    assert Resources._raw({"gpu": 1.0})._h == -1
    # a vector pickled before the hash was kept (its slots' state) loads as it was
    old = Resources.__new__(Resources)
    old.__setstate__((None, {"_d": {"cpu": 3.0}}))
    assert (old._d, old._h, old == Resources(cpu=3)) == ({"cpu": 3.0}, -1, True)
