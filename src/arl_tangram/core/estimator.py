"""Online duration estimates per action kind, from work hints and history.

Invariant: `predict` never returns a negative or non-finite number, and before any observation
of a key it answers from a prior: the submitter's ``expected_s`` when given, else what the
kinds seen so far take (a neutral estimate, `neutral`), else a fixed prior per basis.

Durations are learned as a *unit time*: the measured run time times the speed of the allotment it
ran at (so a run on 4 cores counts as the work it did on one), divided by the work units the
hints name. The basis is chosen from what the submitter gives: ``expected_s`` (learn the ratio of
actual to expected: a user's own estimate wins over every other hint), ``test_count`` (seconds per
test; a test action's number of cases when it names none), ``tokens``, ``items``, or none
(seconds per action). Keys go from specific to general: the kind and tag (language, tool) with
the task and, with no hint at all, the size of the code (in doublings of 256 characters); then
the kind and tag alone; then the neutral estimate. A key answers from its own history once it
has `min_samples` observations, blended from the next key up before. Each key keeps a bounded
reservoir of the most recent unit times; quantiles, means and mean excesses come from it.
Prediction errors (actual over predicted work) are kept per kind (`errors`).

Siblings (issue 39): an action that names its ``siblings`` (the GRPO answers of one prompt, scoped
by tenant) gets a grouped key, its basis followed by `SEP` and the group's name. Each finished
sibling adds its unit time to the group's stats (its count and the sum of the logs) and teaches the
key as an action without siblings would; a sibling's estimate is the key's, shrunk toward the
geometric mean of what its finished siblings took: ``exp((sum log u_i + k log prior) / (n + k))``
(a credibility weight ``n / (n + k)``: Buhlmann's, as James-Stein shrinks a group's mean toward
the grand one), ``k = (1 - rho) / rho`` for a correlation ``rho`` of the logs within a group:
``sibling_prior`` when given, else estimated from the siblings seen (`sibling_k`). Its mean and mean excess are the key's, scaled by the same factor. At
most ``max_groups`` groups are kept, the least recently taught dropped first.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque

from .actions import ActionSpec, WorkHints

# Prior unit time per basis, used until a (key, basis) has observations.
PRIORS = {"expected": 1.0, "tests": 0.05, "tokens": 2e-4, "items": 0.01, "none": 1.0}
_MIN_UNIT = 1e-6
SEP = "\x1f"  # between a grouped key's basis and its group (`DurationEstimator.work_of`)


def basis_of(hints: WorkHints) -> tuple[str, float]:
    """The work basis an action's hints name, and its number of units."""
    if hints.expected_s is not None and hints.expected_s > 0:
        return "expected", hints.expected_s
    if hints.test_count:
        return "tests", float(hints.test_count)
    if hints.tokens:
        return "tokens", float(hints.tokens)
    if hints.items:
        return "items", float(hints.items)
    return "none", 1.0


_KEYS: dict[tuple[object, str | None], str] = {}
_WORK_KEYS: dict[tuple[str, str | None, str, str, int], tuple[str, str]] = {}
# a specific (key, basis) -> the general one it falls back to (and also teaches)
_PARENT: dict[tuple[str, str], tuple[str, str]] = {}


def _size_class(action: ActionSpec) -> int:
    """Doublings of 256 characters in the action's code (0 for none or short code)."""
    p = action.payload
    code = p.get("code") if p else None
    if not isinstance(code, str) or len(code) < 512:
        return 0
    return min(16, len(code).bit_length() - 8)
_bisect_left, _insort = bisect.bisect_left, bisect.insort
# `DurationEstimator._excess_view`'s answer for a key with too little history
_IMMATURE: tuple[list[float], list[float], float] = ([], [], 0.0)
_INF = math.inf


def _key_of(action: ActionSpec) -> str:
    """``action.estimator_key``, memoized by (kind value, tag): the property formats a string
    (``_value_``: an enum member's plain attribute, cheaper to read and hash than the member)."""
    mk = (action.kind._value_, action.tag)
    k = _KEYS.get(mk)
    if k is None:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        k = _KEYS[mk] = action.estimator_key
    return k


class _Sketch:
    """A bounded reservoir of recent values with lazily sorted quantiles, their mean, and the
    mean excess over a level (suffix sums of the sorted values, built on demand)."""

    __slots__ = ("_sorted", "_suffix", "_values", "count")

    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._sorted: list[float] | None = None
        self._suffix: list[float] | None = None  # _suffix[i] = sum(sorted[i:])
        self.count = 0

    def add(self, v: float) -> None:
        vals, s = self._values, self._sorted
        if s is not None and len(vals) == vals.maxlen:
            del s[_bisect_left(s, vals[0])]  # the value the append evicts
        vals.append(v)
        self.count += 1
        if s is not None:
            _insort(s, v)
        self._suffix = None

    def _sums(self) -> tuple[list[float], list[float]]:
        s = self._sorted
        if s is None:
            s = self._sorted = sorted(self._values)
        suf = self._suffix
        if suf is None:
            suf = [0.0] * (len(s) + 1)
            acc = 0.0
            for i in range(len(s) - 1, -1, -1):
                acc += s[i]
                suf[i] = acc
            self._suffix = suf
        return s, suf

    def mean(self) -> float:
        s, suf = self._sums()
        return suf[0] / len(s) if s else 0.0

    def quantile(self, q: float) -> float:
        s = self._sorted
        if s is None:
            s = self._sorted = sorted(self._values)
        i = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
        return s[i]


class DurationEstimator:
    """Per ``ActionSpec.estimator_key`` quantile estimates of execution time at one unit."""

    def __init__(self, reservoir: int = 128, min_samples: int = 3,
                 sibling_prior: float | None = None, max_groups: int = 4096) -> None:
        self._sketches: dict[tuple[str, str], _Sketch] = {}
        self._reservoir = reservoir
        self._min_samples = min_samples
        # (key, basis) -> q -> v, for keys answering from their own history
        self._cache: dict[tuple[str, str], dict[float, float]] = {}
        self._neutral: dict[str, float] = {}  # basis -> the neutral unit time (None: recompute)
        # how many observations it has taken: an answer kept by a caller holds while this is
        # unchanged (`Elastic.plan`'s view of a node's runs)
        self.version = 0
        # `remaining_work`'s view of each key asked at this `version` (`_excess_view`)
        self._views: dict[tuple[str, str], tuple[list[float], list[float], float]] = {}
        self._views_at = -1  # pragma: no mutate (any start: the views start empty)
        # general key -> [predictions scored, sum of |log2(actual / predicted)|, within 2x]
        self._errors: dict[str, list[float]] = {}
        # grouped key -> [finished siblings, sum of the logs of their unit times], least recent first
        self._groups: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._sibling_prior = sibling_prior  # k: the key's estimate counts as k siblings
        # for `sibling_k`: [pairs, sum d_new * d_group, sum d_new ** 2] of the log deviations from
        # the key's estimate of a finishing sibling (d_new) and of its group's mean so far
        self._rho = [0.0, 0.0, 0.0]
        self._max_groups = max_groups

    def observe(self, action: ActionSpec, run_s: float, speed: float = 1.0) -> None:
        """Learn from one finished run of ``action`` that took ``run_s`` at ``speed``."""
        key, units = self.work_of(action)
        self.observe_work(key, units, run_s, speed)

    @staticmethod
    def work_of(action: ActionSpec) -> tuple[tuple[str, str], float]:
        """``((estimator key, basis), units)`` of an action: what `predict_work` and
        `observe_work` take, so a caller that keeps the action works them out only once. The
        key is the most specific one (kind and tag, task, code size); `_PARENT` maps it to
        the kind-and-tag key it falls back to."""
        basis, units = basis_of(action.hints)
        if basis == "none" and action.kind._value_ == "test":
            cases = action.payload.get("cases") if action.payload else None
            if isinstance(cases, list) and cases:
                basis, units = "tests", float(len(cases))
        size = _size_class(action) if basis == "none" else 0
        mk = (action.kind._value_, action.tag, basis, action.task, size)
        key = _WORK_KEYS.get(mk)
        if key is None:  # one shared tuple per (key, basis): records keep it
            if len(_WORK_KEYS) > 4096:
                _WORK_KEYS.clear()
            general = _key_of(action)
            name = general
            if action.task != "default":
                name += "@" + action.task
            if size:
                name += f"#L{size}"
            key = _WORK_KEYS[mk] = (name, basis)
            if name != general:
                _PARENT[key] = (general, basis)
        sib = action.siblings
        if sib is not None:  # (scoped by tenant: another's siblings of the same name are not these)
            tenant = action.tenant
            key = (key[0], key[1] + SEP + (sib if tenant is None else tenant + SEP + sib))
        return key, units

    def observe_work(self, key: tuple[str, str], units: float, run_s: float, speed: float) -> None:
        """`observe`, given the action's `work_of`."""
        if not (run_s >= 0 and run_s < _INF):  # (math.isfinite)
            return
        # max(_MIN_UNIT, run_s * max(speed, _MIN_UNIT) / units), without the builtin's calls
        u = run_s * (_MIN_UNIT if speed < _MIN_UNIT else speed) / units
        unit = u if u > _MIN_UNIT else _MIN_UNIT
        if SEP in key[1]:
            self._sibling_done(key, unit)
            key = (key[0], key[1].partition(SEP)[0])
        self._add(key, unit)
        parent = _PARENT.get(key)
        if parent is not None:
            self._add(parent, unit)
        if self._neutral:
            self._neutral.clear()

    def _sibling_done(self, key: tuple[str, str], unit: float) -> None:
        """Note a finished sibling's unit time in its group's stats (LRU-bounded)."""
        groups = self._groups
        st = groups.get(key)
        lu = math.log(unit)
        if st is None:
            st = groups[key] = [0.0, 0.0]
            if len(groups) > self._max_groups:
                groups.popitem(last=False)
        else:
            groups.move_to_end(key)
            lp = math.log(self.predict_work((key[0], key[1].partition(SEP)[0]), 1.0, 0.5))
            d_new = lu - lp
            r = self._rho
            r[0] += 1.0
            r[1] += d_new * (st[1] / st[0] - lp)
            r[2] += d_new * d_new
        st[0] += 1.0
        st[1] += lu

    def sibling_k(self) -> float:
        """The weight ``k`` of the key's estimate, in siblings: ``sibling_prior`` when given;
        else ``(1 - rho) / rho`` with ``rho`` the moment estimate of the correlation of
        siblings' logs, ``sum d_new * d_group / sum d_new ** 2`` (the deviations from the key's
        estimate of each sibling finishing after others, and of its group's mean so far:
        ``E[d_new d_group] = tau^2`` the variance between groups, ``E[d_new^2] = tau^2 +
        sigma^2``), within [0.01, 0.99]; 1.0 (rho 0.5) before 8 such siblings."""
        if self._sibling_prior is not None:
            return self._sibling_prior
        r = self._rho
        sxx = r[2]
        if r[0] < 8 or sxx <= 0.0:
            return 1.0
        rho = min(0.99, max(0.01, r[1] / sxx))
        return (1.0 - rho) / rho

    def _sibling_unit(self, key: tuple[str, str], q: float) -> tuple[float, float]:
        """(the grouped key's unit estimate at ``q``, that of its key without the group)."""
        base = (key[0], key[1].partition(SEP)[0])
        prior = self.predict_work(base, 1.0, q)
        st = self._groups.get(key)
        if st is None:
            return prior, prior
        k = self.sibling_k()
        return math.exp((st[1] + k * math.log(prior)) / (st[0] + k)), prior

    def sibling_stats(self, key: tuple[str, str]) -> tuple[int, float] | None:
        """(finished siblings, geometric mean of their unit times) of a grouped key, None
        before any (or once dropped)."""
        st = self._groups.get(key)
        return None if st is None else (int(st[0]), math.exp(st[1] / st[0]))

    def _add(self, key: tuple[str, str], unit: float) -> None:
        self.version += 1
        sk = self._sketches.get(key)
        if sk is None:
            sk = self._sketches[key] = _Sketch(self._reservoir)
        sk.add(unit)
        cached = self._cache.get(key)
        if cached:
            cached.clear()

    def neutral(self, basis: str) -> float:
        """The unit time of an action of a kind never seen: the median over the general keys
        of ``basis`` that have history of their own medians (each kind counts once, however
        many of it ran), else the fixed prior. A first bash command beside a stream of Python
        is ranked as a typical action, not behind all of them."""
        v = self._neutral.get(basis)
        if v is None:
            meds = sorted(sk.quantile(0.5) for (k, b), sk in self._sketches.items()
                          if b == basis and sk.count >= self._min_samples
                          and (k, b) not in _PARENT)
            v = meds[(len(meds) - 1) // 2] if meds else PRIORS[basis]
            self._neutral[basis] = v
        return v

    def unit_quantile(self, key: str, basis: str, q: float) -> float:
        """Quantile ``q`` of the unit time of (key, basis); before `min_samples` of its own,
        blended from its general key's, else the neutral estimate."""
        ck = (key, basis)
        cached = self._cache.get(ck)
        if cached is not None:
            v = cached.get(q)
            if v is not None:
                return v
        sk = self._sketches.get(ck)
        n = sk.count if sk is not None else 0
        if sk is not None and n >= self._min_samples:
            v = sk.quantile(q)
            if cached is None:
                cached = self._cache[ck] = {}
            cached[q] = v
            return v
        parent = _PARENT.get(ck)
        prior = self.unit_quantile(parent[0], basis, q) if parent is not None else self.neutral(basis)
        if sk is None or n == 0:
            return prior
        w = n / self._min_samples  # blend toward its own data as it comes
        return w * sk.quantile(q) + (1 - w) * prior

    def note_error(self, key: tuple[str, str], predicted: float, actual: float) -> None:
        """Score one prediction (work at speed 1, made at arrival) against the work done."""
        if not (predicted > 0.0 and actual > 0.0 and actual < _INF):
            return
        if SEP in key[1]:
            key = (key[0], key[1].partition(SEP)[0])
        name = _PARENT.get(key, key)[0]
        e = self._errors.get(name)
        if e is None:
            e = self._errors[name] = [0.0, 0.0, 0.0]
        r = math.log2(actual / predicted)
        e[0] += 1.0
        e[1] += r if r >= 0.0 else -r
        if -1.0 <= r <= 1.0:
            e[2] += 1.0

    def errors(self) -> dict[str, dict[str, float]]:
        """Per kind (and tag): predictions scored, the mean of |log2(actual / predicted)| (1.0:
        off by 2x on average) and the share within 2x of the actual."""
        return {k: {"scored": int(e[0]), "mean_abs_log2": round(e[1] / e[0], 4),
                    "within_2x": round(e[2] / e[0], 4)}
                for k, e in sorted(self._errors.items()) if e[0] > 0}

    def predict(self, action: ActionSpec, q: float = 0.5, speed: float = 1.0) -> float:
        """Expected execution time (quantile ``q``) of ``action`` running at ``speed``."""
        key, units = self.work_of(action)
        if SEP in key[1]:
            unit = self._sibling_unit(key, q)[0]
        else:
            unit = self.unit_quantile(key[0], key[1], q)
        return unit * units / max(speed, _MIN_UNIT)

    def predict_work(self, key: tuple[str, str], units: float, q: float) -> float:
        """`predict` at speed 1, given the action's `work_of` (same arithmetic)."""
        cached = self._cache.get(key)
        if cached:
            v = cached.get(q)
            if v is not None:
                return v * units
        if SEP in key[1]:  # (a grouped key is never cached)
            return self._sibling_unit(key, q)[0] * units
        sk = self._sketches.get(key)
        s = sk._sorted if sk is not None and sk.count >= self._min_samples else None
        if cached is not None and s is not None:  # `unit_quantile` -> `sk.quantile(q)`, inlined
            n = len(s)
            i = math.ceil(q * n) - 1  # min(n - 1, max(0, i)), without the builtins' calls
            if i < 0:
                i = 0
            if i > n - 1:
                i = n - 1
            v = cached[q] = s[i]
        else:
            v = self.unit_quantile(key[0], key[1], q)
        return v * units

    def mean_work(self, key: tuple[str, str], units: float) -> float | None:
        """Expected work (seconds at speed 1) of an action of ``work_of`` (key, units): the
        mean of the learned unit times x units; None before `min_samples` observations (the
        caller keeps its quantile estimate). Sizes in the sum-of-completion-times comparisons
        of elastic widths are means, as that objective asks, not medians."""
        if SEP in key[1]:  # the key's, scaled as its median is by the siblings
            unit, prior = self._sibling_unit(key, 0.5)
            base = (key[0], key[1].partition(SEP)[0])
            got = self.mean_work(base, units)
            return None if got is None else got * (unit / prior)
        sk = self._mature(key)
        return None if sk is None else sk.mean() * units

    def _mature(self, key: tuple[str, str]) -> _Sketch | None:
        """The sketch of ``key``, or of its general key, with `min_samples` observations."""
        sk = self._sketches.get(key)
        if sk is not None and sk.count >= self._min_samples:
            return sk
        parent = _PARENT.get(key)
        sk = self._sketches.get(parent) if parent is not None else None
        return sk if sk is not None and sk.count >= self._min_samples else None

    def remaining_work(self, key: tuple[str, str], units: float, done: float) -> float | None:
        """Expected work left of an action that has done ``done`` (seconds at speed 1): the
        mean excess of the learned unit times over what it did per unit (a run that has
        outlived its median is likely longer than its median says: SERPT, not SRPT on a
        stale guess); None before `min_samples` observations. With ``a`` the work done per
        unit (at the key's scale): E[V - a | V > a] per unit over the reservoir; where no value
        exceeds ``a``, a quarter of ``a`` (it has outlived every run seen: assume it is near
        its end, not at it). A crowded node's walks ask this of every elastic run there at
        every event (issue 40): each asks a bisection of the key's view, kept per `version`."""
        if self._views_at != self.version:
            self._views.clear()
            self._views_at = self.version
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self._excess_view(key)
        s, suf, f = view
        if f == 0.0:  # (`_IMMATURE`)
            return None
        units *= f
        if units <= 0:
            return None
        a = done / units
        i, hi = 0, len(s)  # bisect_right(s, a) on typed floats: compiled, each step a native
        while i < hi:  # comparison, not the library's generic one (~5x cheaper; issue 40)
            mid = (i + hi) // 2
            if a < s[mid]:
                hi = mid
            else:
                i = mid + 1
        n = len(s) - i
        if n <= 0:
            return 0.25 * a * units
        return (suf[i] / n - a) * units

    def _excess_view(self, key: tuple[str, str]) -> tuple[list[float], list[float], float]:
        """``(sorted unit values, their suffix sums, scale)`` that `remaining_work` reads for
        ``key``: its mature sketch's (`_mature`), scale 1; a grouped key's is its key's without
        the group, scaled by the siblings (f * excess(a / f)); `_IMMATURE` before
        `min_samples` observations."""
        f = 1.0
        if SEP in key[1]:
            unit, prior = self._sibling_unit(key, 0.5)
            f = unit / prior
            key = (key[0], key[1].partition(SEP)[0])
        sk = self._mature(key)
        if sk is None:
            return _IMMATURE
        s, suf = sk._sums()
        return s, suf, f

    def samples(self, key: str) -> int:
        """How many observations the estimator has for ``key`` (all bases; a general key
        counts those of its specific ones too)."""
        return sum(sk.count for (k, _), sk in self._sketches.items() if k == key)
