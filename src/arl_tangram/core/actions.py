"""The unified action model: what an action asks for, and what became of it.

An `ActionSpec` is everything the scheduler may know about one unit of external work: its kind,
its demand at the minimum allotment, how it can stretch (elasticity), hints about how much work
it carries, where its state lives (session), which reward model it needs, and the payload the
resource manager will execute (opaque to the core). The true duration is never part of the spec:
the core predicts it (see `estimator`), the executor measures it.

`Status` is ordered: an action only moves forward (PENDING < QUEUED < STARTING < RUNNING <
terminal). Terminal statuses share one rank; `is_finished` tells them apart from live ones.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidAction
from .resources import CPU, Resources

# The largest hints the core takes (`WorkHints`): counts stay exact as floats and a prediction
# (units x seconds per unit) stays finite. The HTTP API bounds them tighter (docs/api.md).
MAX_HINT_UNITS = 10**12
MAX_HINT_S = 1e9


class ActionKind(enum.StrEnum):
    """Kinds the managers know how to execute. ``CUSTOM`` carries its own ``tag``."""

    CODE = "code"  # run a program (SandboxFusion run_code semantics)
    TEST = "test"  # a program plus a batch of test cases
    TOOL = "tool"  # a tool call, usually inside a session
    REWARD = "reward"  # score with a reward model (GPU manager)
    JUDGE = "judge"  # generative judge (GPU manager)
    CUSTOM = "custom"  # user-defined
    # provider calls (core/providers.py): the provider is named by ``tag``; they wait for its
    # token bucket, slots and budget, not for a node
    SEARCH = "search"  # a web search (or the local retriever standing in for one)
    FETCH = "fetch"  # a page fetch
    HTTP = "http"  # any other call to a declared provider
    RETRIEVE = "retrieve"  # a local retriever's search: a batched model like a reward model

    @property
    def uses_model(self) -> bool:
        return self in _MODEL_KINDS  # (a module tuple: reading members off the class is slow)


_MODEL_KINDS = (ActionKind.REWARD, ActionKind.JUDGE, ActionKind.RETRIEVE)


class Status(enum.IntEnum):
    """Life of an action. Ordered; terminal statuses are all >= SUCCEEDED."""

    PENDING = 0  # arrived, not yet considered
    QUEUED = 1  # waiting for capacity (or for a model instance / batch)
    STARTING = 2  # StartAction / RunBatch issued, executor has not confirmed
    RUNNING = 3  # executing on a node
    SUCCEEDED = 10
    FAILED = 11  # ran, and the work itself failed (non-zero exit, exception in scoring)
    TIMED_OUT = 12
    CANCELLED = 13
    REJECTED = 14  # can never be satisfied (no node could ever fit it), or invalid
    NODE_LOST = 15  # the node died while the action was on it and it could not be re-run

    @property
    def is_finished(self) -> bool:
        return self >= Status.SUCCEEDED


@dataclass(frozen=True, slots=True)
class Speedup:
    """How execution time shrinks with the allotment ``k`` of the elastic dimension.

    ``factor(k)`` is the speed relative to one unit: below one unit (a fractional CPU quota)
    work runs proportionally slower; above it, Amdahl's law with ``parallel_fraction``.
    """

    parallel_fraction: float = 0.0  # share of the work that parallelizes (0 = serial, 1 = linear)

    def __post_init__(self) -> None:
        if not 0.0 <= self.parallel_fraction <= 1.0:
            raise ValueError(f"parallel_fraction must be in [0, 1], got {self.parallel_fraction}")

    def factor(self, k: float) -> float:
        if k <= 0:
            return 0.0
        if k <= 1.0:
            return k
        p = self.parallel_fraction
        return 1.0 / ((1.0 - p) + p / k)


@dataclass(frozen=True, slots=True)
class Elasticity:
    """The range of allotments an action can use along one dimension."""

    min: float = 1.0  # smallest allotment it can start with
    max: float = 1.0  # largest allotment it can use
    dim: str = CPU  # the dimension that stretches
    speedup: Speedup = field(default_factory=Speedup)

    def __post_init__(self) -> None:
        if self.min <= 0 or math.isnan(self.min):
            raise ValueError(f"elasticity.min must be > 0, got {self.min}")
        if not self.max >= self.min:  # (NaN too)
            raise ValueError(f"elasticity.max ({self.max}) must be >= elasticity.min ({self.min})")

    @property
    def is_elastic(self) -> bool:
        return self.max > self.min


@dataclass(frozen=True, slots=True)
class WorkHints:
    """What the submitter knows about the amount of work (all optional)."""

    expected_s: float | None = None  # the submitter's own estimate at one unit of allotment
    test_count: int | None = None  # number of test cases in a test action
    tokens: int | None = None  # tokens to score / generate (reward, judge)
    items: int | None = None  # number of scored items (several scores of one response)
    # prompt tokens of a judge engine's request (kind genjudge): a later request of the same
    # trajectory whose prompt extends this one finds them in the prefix cache of the instance
    # that served it (`CoreConfig.engine_routing`). Not in the repr: streams without it unchanged
    prompt_tokens: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """InvalidAction (naming ``hints.<field>``) for a hint the core cannot hold: negative,
        NaN, or past `MAX_HINT_S` / `MAX_HINT_UNITS` (a count too large for a float would make
        the estimator raise on arrival)."""
        e = self.expected_s
        if e is not None and not 0 <= e <= MAX_HINT_S:  # (NaN fails both)
            raise InvalidAction("hints.expected_s",
                                f"must be a number in [0, {MAX_HINT_S:g}], got {_short(e)}")
        for name, v in (("test_count", self.test_count), ("tokens", self.tokens),
                        ("items", self.items), ("prompt_tokens", self.prompt_tokens)):
            if v is not None and not 0 <= v <= MAX_HINT_UNITS:
                raise InvalidAction(f"hints.{name}",
                                    f"must be in [0, {MAX_HINT_UNITS}], got {_short(v)}")


def _short(v: object) -> str:
    """``repr(v)``, a huge integer shortened to its number of digits."""
    if isinstance(v, int) and not -10**30 < v < 10**30:
        return f"an integer of {len(str(abs(v)))} digits"
    return repr(v)


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One unit of external work, as submitted."""

    id: str  # unique id (the engine assigns one when the client does not)
    kind: ActionKind = ActionKind.CODE
    demand: Resources = field(default_factory=lambda: Resources(cpu=1, memory_mb=256))
    elasticity: Elasticity | None = None  # None: rigid, runs at exactly `demand`
    hints: WorkHints = field(default_factory=WorkHints)
    task: str = "default"  # task family (swe-agent, code-rl, ...); pools of task-isolated
    trajectory: str | None = None  # rollout this action belongs to
    session: str | None = None  # session whose node the action must run on
    model: str | None = None  # reward model / judge name for REWARD and JUDGE
    tag: str | None = None  # sub-kind for estimation (language, tool name, CUSTOM name)
    timeout_s: float = 60.0  # wall-clock limit of execution (not counting queueing)
    weight: float = 1.0  # importance in the ACT objective
    idempotent: bool = True  # safe to re-run after a node loss
    payload: Mapping[str, Any] = field(default_factory=dict)  # what the manager executes
    # who submitted it (the API's tenant; None: nobody named): with `CoreConfig.tenant_shares`
    # the core serves tenants in weighted fair order (docs/core.md, "Tenants' fair share").
    # Not in the repr: the streams of runs without tenants stay as they were.
    tenant: str | None = field(default=None, repr=False)
    # the client's name for the action's siblings (the GRPO answers of one prompt: issue 39), whose
    # sizes are alike: the estimator blends what its finished siblings took into its estimate
    # (docs/core.md, "Estimates from siblings"); scoped by tenant. Not in the repr, as tenant.
    # (Not the API's fan-out groups: those are the parts of one request.)
    siblings: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("action id must be a non-empty string")
        if self.kind.uses_model and not self.model:
            raise ValueError(f"action {self.id}: kind {self.kind.value!r} needs a model name")
        if not self.timeout_s > 0:  # (NaN too)
            raise ValueError(f"action {self.id}: timeout_s must be > 0, got {self.timeout_s}")
        if not 0 < self.weight < math.inf:
            raise ValueError(f"action {self.id}: weight must be > 0 and finite, got {self.weight}")
        el = self.elasticity
        if el is not None and abs(self.demand.get(el.dim) - el.min) > 1e-9:
            object.__setattr__(self, "demand", self.demand.with_amount(el.dim, el.min))

    @property
    def estimator_key(self) -> str:
        return f"{self.kind.value}:{self.tag}" if self.tag else self.kind.value

    def allotment(self, k: float | None = None) -> Resources:
        """The demand with the elastic dimension set to ``k`` (default: the minimum)."""
        el = self.elasticity
        if el is None or k is None:
            return self.demand
        return self.demand.with_amount(el.dim, min(max(k, el.min), el.max))

    def speed(self, allotment: Mapping[str, float]) -> float:
        """Speed factor of running at ``allotment`` relative to one unit of the elastic dim;
        for a rigid action, relative to its demand: below it (a fractional CPU slice) it runs
        proportionally slower, as under a CFS quota."""
        el = self.elasticity
        if el is None:
            need = self.demand.get(CPU)
            if need <= 0.0:
                return 1.0
            got = allotment.get(CPU, 0.0)
            return 1.0 if got >= need else got / need
        return el.speedup.factor(allotment.get(el.dim, 0.0))


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What became of an action. Times are on the clock of whoever drove the core."""

    id: str
    status: Status
    submit_time: float
    start_time: float | None = None
    finish_time: float | None = None
    node: str | None = None
    allotment: Resources | None = None
    output: Any = None  # the manager's result (e.g. a run_code response); opaque to the core
    reason: str = ""  # why it was rejected / lost / failed, in words
    attempts: int = 1  # times it was started (re-runs after node loss count)

    @property
    def act(self) -> float | None:
        """Action completion time: finish - submit, queueing included."""
        if self.finish_time is None:
            return None
        return self.finish_time - self.submit_time
