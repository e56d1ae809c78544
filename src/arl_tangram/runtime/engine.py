"""Engine: the asyncio driver that owns the core, feeds it events, and executes its commands.

Invariants:
- The core is single-threaded: every event, whether it comes from a client (submit, cancel,
  sessions), from the executor (outcomes) or from the ticker, enters one queue and is handled by
  one loop task, in order. Every event is stamped with the engine's clock on entry; times the
  executor put on events are replaced (nodes have their own clocks).
- An action id is delivered at most once; a retried submit with the same idempotency key maps to
  the same action and never runs it twice.
- Memory is bounded: finished results expire after ``result_ttl_s`` or past ``max_results``
  (oldest first), idempotency keys after ``idempotency_ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import commands as C
from ..core import events as E
from ..core.actions import ActionResult, ActionSpec, Status
from ..core.cluster import ModelSpec, NodeSpec
from ..core.config import CoreConfig
from ..core.errors import ClosedError, InvalidAction, TangramError
from ..core.images import warm_key
from ..core.protocol import Inspectable, Scheduler
from ..core.resources import Resources
from ..core.view import InstanceView, NodeView
from .clock import Clock, MonotonicClock
from .executor import Executor, SessionOpened
from .images import SessionImage
from .stats import Live, StatsBook
from .views import ClusterView, ModelDown, NodeRow, StatsView

log = logging.getLogger(__name__)


class Overloaded(TangramError):
    """The engine holds ``max_pending`` unfinished actions; the submit was shed."""


class UnknownAction(TangramError, KeyError):
    """No action (live or remembered) has this id."""


class Opening(enum.Enum):
    """`Engine.wait_open`'s answers that are not a node's: ``OPENING``, a session not open yet
    (no node has room for it, or its node has not answered in time: it opens later, or its next
    action is told why not); ``EXPIRED``, one whose own ``ttl_s`` passed before its node
    reported it open (the client's choice, not the node's failure)."""

    OPENING = "opening"
    EXPIRED = "expired"


OPENING, EXPIRED = Opening.OPENING, Opening.EXPIRED


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Knobs of the engine (the service config's ``limits`` map onto these) and the core's
    config, built once (`ServiceConfig.core`): the one way to name the policy and the
    scheduler's fields."""

    core: CoreConfig = field(default_factory=CoreConfig)  # the policy and the core's knobs
    models: tuple[ModelSpec, ...] = ()  # reward models the core may schedule
    tick_s: float = 0.5  # period of Tick events
    result_ttl_s: float = 600.0  # finished results kept this long
    max_results: int = 100_000  # and at most this many
    idempotency_ttl_s: float = 3600.0  # idempotency keys kept this long
    max_pending: int = 100_000  # unfinished actions beyond which submits are shed
    act_window: int = 10_000  # ACT samples per kind kept for percentiles

    def __post_init__(self) -> None:
        for name in ("tick_s", "result_ttl_s", "idempotency_ttl_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_results", "max_pending", "act_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def policy(self) -> str:
        """The core's policy (`CoreConfig.policy`)."""
        return self.core.policy


@dataclass(frozen=True, slots=True)
class _Down:
    """A model with no instance up since one died (`Engine._model_died`)."""

    node: str  # where its instance died
    reason: str
    since: float  # engine time of the death


def make_core(config: EngineConfig, nodes: Sequence[NodeSpec]) -> Scheduler:
    """The production core for ``config.policy`` over ``nodes`` and ``config.models``."""
    from ..core.cluster import ClusterSpec
    from ..core.core import Core

    return Core(ClusterSpec(tuple(nodes), tuple(config.models)), config.core)


TTL_EXPIRED = "ttl expired"  # the reason of the core's CloseSession for an idle session
_STOP = object()
_REST: dict[type, tuple[str, ...] | None] = {}  # event class -> its fields after ``time``


def _restamp(ev: E.Event, now: float) -> E.Event:
    """``dataclasses.replace(ev, time=now)`` at half the cost, for event classes whose first
    field is ``time`` and whose fields are all ``__init__`` arguments (all of core.events)."""
    cls = type(ev)
    if cls not in _REST:
        fs = dataclasses.fields(ev)
        ok = bool(fs) and fs[0].name == "time" and all(f.init for f in fs)
        _REST[cls] = tuple(f.name for f in fs[1:]) if ok else None
    rest = _REST[cls]
    if rest is None:
        return dataclasses.replace(ev, time=now)
    return cls(now, *[getattr(ev, n) for n in rest])
UPLOAD_SPOOL_PREFIX = "tangram-upload-"  # the spool directory of an uploaded image's archive
_NO_TIMER_S = 1e7  # waits longer than this (about 4 months) are waits without a timer


def _time_up(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


class Engine:
    """Drives one core with the real clock and one executor."""

    def __init__(
        self,
        executor: Executor,
        config: EngineConfig | None = None,
        *,
        clock: Clock | None = None,
        core_factory: Callable[[EngineConfig, Sequence[NodeSpec]], Scheduler] = make_core,
    ) -> None:
        self.config = config or EngineConfig()
        self.clock: Clock = clock or MonotonicClock()
        self._executor = executor
        self._core_factory = core_factory
        self.core: Scheduler | None = None  # made by `start` (`core_factory`)
        self.nodes: dict[str, NodeSpec] = {}
        self.started_at: float | None = None
        self.stats_book = StatsBook(self.config.act_window)
        self._live: dict[str, Live] = {}
        self._results: OrderedDict[str, tuple[ActionResult, str]] = OrderedDict()
        self._idem: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._waiters: dict[str, list[asyncio.Future[ActionResult | None]]] = {}
        self._sessions: dict[str, Resources] = {}
        self._session_nodes: dict[str, str] = {}
        # sessions asked for -> what `wait_open` answers: None once the node opened it, else why
        # it is not open, or OPENING (only for an executor whose nodes report opens:
        # `Executor.reports_session_open`); kept until read (oldest answered ones forgotten
        # past `max_results`)
        self._opening: OrderedDict[str, asyncio.Future[str | Opening | None]] = OrderedDict()
        # sessions evicted because their node ran short of memory (issue 26) -> why, for the
        # next action naming one (oldest forgotten past `max_results`)
        self._evicted: OrderedDict[str, str] = OrderedDict()
        # models whose last ready instance died (an unsolicited ModelUnloaded): model -> the
        # death's node, reason and engine time, until an instance of it is loaded again (the
        # instances themselves are the core's: `_instance`, `Inspectable.instances_of`)
        self._models_down: dict[str, _Down] = {}
        self.model_recoveries: list[float] = []  # seconds from each such death to the reload
        self._queue: asyncio.Queue[Any] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._closed = False
        # executes the core's provider calls (issue 37: `managers.api.ApiManager.call`); it
        # answers each with `ActionFinished` or `ProviderThrottled` through the executor's emit
        self.provider_calls: Callable[[C.CallProvider | C.CancelAction], None] | None = None
        self.api: Any = None  # that manager's front door (`runtime.providers.ProviderFront`)
        # more sections of `stats()` (name -> a function of nothing), e.g. "providers"
        self.extra_stats: dict[str, Callable[[], Any]] = {}
        self._imported: set[str] = set()  # images imported through `import_image` (their source)
        # called with each result as it is delivered (`_deliver`): what a caller holds for an
        # action (a tenant's quota, issue 41) is released from the delivery, not by polling
        self.on_delivered: list[Callable[[ActionResult], None]] = []
        # called with (session id, why) when a session leaves `session_count`: closed by the
        # client, expired (the core's TTL), evicted, lost with its node, or never opened
        self.on_session_gone: list[Callable[[str, str], None]] = []

    # ---- life ------------------------------------------------------------------------------

    async def start(self) -> Engine:
        if self._queue is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._queue = asyncio.Queue()
        specs = await self._executor.start(self._emit)
        self.core = self._core_factory(self.config, specs)
        self.started_at = self.clock.now()
        for spec in specs:
            self.nodes[spec.name] = spec
        self._tasks = [self._loop.create_task(self._run(), name="tangram-engine"),
                       self._loop.create_task(self._ticker(), name="tangram-ticker")]
        return self

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, grace_s: float = 0.0) -> None:
        """Stop accepting work, let live actions finish for ``grace_s``, then stop everything.

        Actions still unfinished at the end are delivered as CANCELLED.
        """
        if self._closed:
            return
        self._closed = True
        if self._queue is None:
            return
        if grace_s > 0 and self._live:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained(), grace_s)
        await self._executor.aclose()
        if self.api is not None:  # the API manager's calls and connection pools (issue 37)
            await self.api.aclose()
        await asyncio.sleep(0)
        self._tasks[1].cancel()  # the ticker
        self._queue.put_nowait(_STOP)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        now = self.clock.now()
        for aid, live in list(self._live.items()):
            self._deliver(ActionResult(aid, Status.CANCELLED, live.submit_time, finish_time=now,
                                       reason="engine closed"))
        for sid in list(self._opening):
            self._open_result(sid, "the engine closed before it opened")

    async def _drained(self) -> None:
        while self._live:
            await asyncio.sleep(0.05)

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- the loop --------------------------------------------------------------------------

    def _emit(self, event: E.Event) -> None:
        """Executor callback: stamp with our clock and enqueue (thread-safe)."""
        if self._queue is None:
            return
        if threading.get_ident() != self._thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self._emit, event)
            return
        self._queue.put_nowait(_restamp(event, self.clock.now()))

    def _put(self, event: E.Event) -> None:
        if self._queue is None:
            raise ClosedError("the engine is not started")
        self._queue.put_nowait(event)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            self._put(E.Tick(self.clock.now()))

    async def _run(self) -> None:
        assert self._queue is not None
        q = self._queue
        while True:
            batch = [await q.get()]
            while not q.empty():
                batch.append(q.get_nowait())
            commands: list[C.Command] = []
            stop = False
            for ev in batch:
                if ev is _STOP:
                    stop = True
                    continue
                commands.extend(self._handle(ev))
            out = [c for c in commands if not self._take(c)]
            if out and not self._closed:
                try:
                    await self._executor.submit(out)
                except Exception:
                    log.exception("executor refused %d commands", len(out))
            if isinstance(batch[-1], E.Tick):
                self._expire()
            if stop:
                return

    def _handle(self, ev: E.Event) -> list[C.Command]:
        if type(ev) is SessionOpened:  # (the engine's own: its client is answered)
            self._open_result(ev.session_id, None)
            return []
        self._observe(ev)
        core = self.core
        assert core is not None  # (made by `start`, before the loop runs)
        if self._evicted and isinstance(ev, E.ActionArrived | E.ActionsArrived):
            ev = self._session_arrivals(ev)  # type: ignore[assignment]
            if ev is None:
                return []
        try:
            out = list(core.handle(ev))
        except Exception as exc:
            log.exception("core failed on %r", ev)
            return self._core_failed(ev, exc)
        if type(ev) is E.SessionRequested and ev.session_id in self._opening and not any(
                type(c) is C.OpenSession and c.session_id == ev.session_id for c in out):
            self._open_result(ev.session_id, OPENING)  # (no node has room yet: it waits)
        return out

    def _core_failed(self, ev: E.Event, exc: Exception) -> list[C.Command]:
        """The core raised on ``ev``: no action it names is left waiting for a result that
        will never come (issue 35, H2). An arrival the core could not take ends REJECTED, a
        cancel CANCELLED, a finish FAILED, each with the error as its reason (its waiters
        answered, its place in ``max_pending`` and in its tenant's quota freed); the core is
        then asked to forget it (a cancel: it may hold a record). Of a batch that raised, the
        actions the core had not reached yet arrive again one by one, and those it had queued
        stay. A session the core could not open is closed (`_session_failed`). An event that
        names neither (a tick, a node's report) is only logged."""
        why = f"the scheduler could not take this event ({type(exc).__name__}: {exc})"
        if isinstance(ev, E.ActionsArrived):
            core = self.core
            out: list[C.Command] = []
            failed: list[str] = []
            for spec in ev.actions:
                st = core.status(spec.id) if isinstance(core, Inspectable) else Status.PENDING
                if st is None:  # not reached before the raise: on its own
                    out.extend(self._handle(E.ActionArrived(ev.time, spec)))
                elif st is Status.PENDING or st.is_finished:  # the one that raised (or its
                    failed.append(spec.id)                    # result went with the raise)
            return self._fail(failed, Status.REJECTED, why, ev.time) + out
        if isinstance(ev, E.ActionArrived):
            return self._fail([ev.action.id], Status.REJECTED, why, ev.time)
        if isinstance(ev, E.CancelRequested):
            return self._fail([ev.action_id], Status.CANCELLED,
                              f"cancelled by request; {why}", ev.time, forget=False)
        if isinstance(ev, E.ActionFinished):
            return self._fail([ev.action_id], Status.FAILED, why, ev.time)
        if isinstance(ev, E.SessionRequested):  # not left "opening", holding max_sessions
            return self._session_failed(ev, why)
        return []

    def _session_arrivals(self, ev: E.ActionArrived | E.ActionsArrived
                          ) -> E.ActionArrived | E.ActionsArrived | None:
        """``ev`` without the actions naming a session that is gone (`session_gone`: it
        expired, was evicted, lost with its node) while they were on their way: each is
        rejected with that reason, never run in a new sandbox that the core would open under
        the old id with the state gone (issue 41, H3). None: nothing left."""
        specs = (ev.action,) if isinstance(ev, E.ActionArrived) else ev.actions
        gone = [(s, why) for s in specs if s.session is not None
                and (why := self.session_gone(s.session)) is not None]
        if not gone:
            return ev
        for s, why in gone:
            live = self._live.get(s.id)
            if live is not None:
                self._deliver(ActionResult(s.id, Status.REJECTED, live.submit_time,
                                           finish_time=ev.time, reason=why))
        dropped = {s.id for s, _ in gone}
        rest = tuple(s for s in specs if s.id not in dropped)
        if not rest:
            return None
        if len(rest) == 1:
            return E.ActionArrived(ev.time, rest[0])
        return E.ActionsArrived(ev.time, rest)

    def _session_failed(self, ev: E.SessionRequested, why: str) -> list[C.Command]:
        """A session the core could not open is not open: it leaves the engine's count (and
        its tenant's), and an action naming it is told why (`session_gone`); the core is asked
        to close what it may hold of it."""
        sid = ev.session_id
        self._drop_session(sid, f"session {sid!r} could not be opened: {why}", remember=True)
        if self.core is None:
            return []
        try:
            return list(self.core.handle(E.SessionClosed(ev.time, sid, "could not be opened")))
        except Exception:
            log.exception("core failed to close session %s", sid)
            return []

    def _fail(self, ids: Sequence[str], status: Status, reason: str, now: float, *,
              forget: bool = True) -> list[C.Command]:
        """Deliver ``status`` with ``reason`` for each of ``ids`` still live, then (``forget``)
        cancel it in the core, whose commands (a CancelAction for a node) are returned; its own
        Deliver comes second and is ignored."""
        out: list[C.Command] = []
        for aid in ids:
            live = self._live.get(aid)
            if live is None:
                continue
            self._deliver(ActionResult(aid, status, live.submit_time, finish_time=now,
                                       node=live.node, reason=reason))
            if forget and self.core is not None:
                try:
                    out.extend(self.core.handle(E.CancelRequested(now, aid)))
                except Exception:
                    log.exception("core failed to forget action %s", aid)
        return out

    def _observe(self, ev: E.Event) -> None:
        if isinstance(ev, E.NodeAdded):  # a node that joined later (Ray executor)
            self.nodes[ev.node.name] = ev.node
        elif isinstance(ev, E.ActionStarted):
            live = self._live.get(ev.action_id)
            if live is not None:
                live.started = True
        elif isinstance(ev, E.ModelLoaded):  # (the core has not seen it yet: it holds the
            sb = self.stats_book                # instance as loading)
            if not ev.ok:
                sb.model_load_failures += 1
            else:
                sb.model_swaps += ev.from_host
                sb.model_loads += not ev.from_host
                inst = self._instance(ev.instance_id)
                if inst is not None:
                    self._model_up(inst.model, ev.time)
        elif isinstance(ev, E.ModelUnloaded) and ev.reason:  # (died: the core still holds it)
            inst = self._instance(ev.instance_id)
            if inst is not None:
                self._model_died(inst, ev.reason, ev.time)
        elif isinstance(ev, E.SessionClosed) and ev.reason != "closed by client":
            # (a client's close left the count at `close_session`: the id may be open again)
            self._drop_session(ev.session_id, f"session {ev.session_id!r} is not open: "
                               f"{ev.reason or 'closed by its node'}", remember=True)
        elif isinstance(ev, E.NodeLost):  # the core closes its sessions without a command
            for sid in [s for s, n in self._session_nodes.items() if n == ev.node]:
                self._drop_session(sid, f"session {sid!r} is not open: node {ev.node} "
                                   f"lost: {ev.reason}", remember=True)

    def _drop_session(self, sid: str, why: str, *, remember: bool) -> None:
        """``sid`` is no longer open: it leaves the count (`limits.max_sessions`), its tenant
        is told (`on_session_gone`) and, with ``remember``, an action naming it later is told
        ``why`` (`session_gone`) instead of running in a new sandbox (issue 41, H3)."""
        self._session_nodes.pop(sid, None)
        self._open_result(sid, why)
        if self._sessions.pop(sid, None) is None:
            return
        if remember:
            self._evicted[sid] = why
            self._evicted.move_to_end(sid)
            while len(self._evicted) > self.config.max_results:
                self._evicted.popitem(last=False)
        for fn in self.on_session_gone:
            try:
                fn(sid, why)
            except Exception:
                log.exception("a session-gone listener failed on %s", sid)

    def _open_result(self, sid: str, why: str | Opening | None) -> None:
        fut = self._opening.get(sid)
        if fut is not None and not fut.done():
            fut.set_result(why)

    async def wait_open(self, session_id: str, timeout: float) -> str | Opening | None:
        """Wait until ``session_id`` (just asked for) is open on its node: None once it is (or
        at once where the nodes do not report opens); `OPENING` when the core found no node
        with room for it yet (it opens when room frees: not waited for), or when its node has
        not answered within ``timeout`` s; else why it could not be opened (the node's
        reason: the layer budget spent, a sandbox that could not start, ...)."""
        fut = self._opening.get(session_id)
        if fut is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return OPENING
        finally:
            self._opening.pop(session_id, None)  # (answered: read once)

    def _instance(self, instance_id: str) -> InstanceView | None:
        """The core's model instance of that id (None: it holds none, or shows none)."""
        core = self.core
        return core.instance(instance_id) if isinstance(core, Inspectable) else None

    def _model_died(self, inst: InstanceView, reason: str, now: float) -> None:
        """An instance died under the core (its worker): while its model has no other loaded
        instance (ready or busy, in the core), the model is down and its node reports itself
        not ready."""
        model = inst.model
        log.warning("model %s: instance %s on node %s died: %s", model, inst.id, inst.node,
                    reason)
        if model in self._models_down:
            return
        core = self.core
        others: list[InstanceView] = (core.instances_of(model) if isinstance(core, Inspectable)
                                      else [])
        if any(i.id != inst.id and i.state != "loading" for i in others):
            return
        self._models_down[model] = _Down(inst.node, reason, now)

    def _model_up(self, model: str, now: float) -> None:
        down = self._models_down.pop(model, None)
        if down is not None:
            took = now - down.since
            self.model_recoveries.append(took)
            log.warning("model %s: ready again %.3f s after its instance died", model, took)

    def _take(self, cmd: C.Command) -> bool:
        """Handle what the engine itself executes (Deliver); note what the others hold."""
        if isinstance(cmd, C.Deliver):
            self._deliver(cmd.result)
            return True
        if isinstance(cmd, C.WakeAt | C.CallProvider) or (isinstance(cmd, C.CancelAction)
                                                          and not cmd.node):
            self._provider_command(cmd)  # (a CancelAction on no node: a provider call's)
            return True
        if isinstance(cmd, C.StartAction):
            live = self._live.get(cmd.action.id)
            if live is not None:
                live.node, live.allotment = cmd.node, cmd.allotment
            sb = self.stats_book
            sb.warm_hits += cmd.warm
            sb.warm_misses += not cmd.warm
        elif isinstance(cmd, C.ResizeAction):
            live = self._live.get(cmd.action_id)
            if live is not None:
                live.allotment = cmd.allotment
        elif isinstance(cmd, C.OpenSession):
            self._session_nodes[cmd.session_id] = cmd.node
            self._sessions[cmd.session_id] = cmd.demand
            self._evicted.pop(cmd.session_id, None)
        elif isinstance(cmd, C.EvictSession):  # (executed as a CloseSession by its node)
            self._drop_session(cmd.session_id, cmd.reason, remember=True)
            self._evicted[cmd.session_id] = cmd.reason  # (also when no longer counted)
            self.stats_book.session_evictions += 1
            log.warning("%s", cmd.reason)
        elif isinstance(cmd, C.CloseSession) and cmd.reason == TTL_EXPIRED:
            # the core's own close: the session was idle past its ttl_s (a client's close left
            # the count at `close_session`; a node's report at `_observe`)
            sid = cmd.session_id
            self._open_result(sid, EXPIRED)  # (one still opening: its open is answered so)
            self._drop_session(sid, f"session {sid!r} is not open: it expired (no action for "
                               "its ttl_s); its state is gone (open a new session)", remember=True)
        return False

    def _provider_command(self, cmd: C.WakeAt | C.CallProvider | C.CancelAction) -> None:
        """The core's provider commands (issue 37): a `Wake` at the time a WakeAt names (a
        millisecond late, so the token is there); a call, or its cancel, to the API manager."""
        if self._closed or self._loop is None:
            return
        if isinstance(cmd, C.WakeAt):
            self._loop.call_later(max(0.0, cmd.time - self.clock.now()) + 1e-3, self._wake)
        elif self.provider_calls is not None:
            self.provider_calls(cmd)
        elif isinstance(cmd, C.CallProvider):
            self._emit(E.ActionFinished(self.clock.now(), cmd.action.id, Status.FAILED,
                                        reason=f"provider {cmd.provider!r}: no API manager runs here"))

    def _wake(self) -> None:
        if self._queue is not None and not self._closed:
            self._queue.put_nowait(E.Wake(self.clock.now()))

    def _deliver(self, result: ActionResult) -> None:
        live = self._live.pop(result.id, None)
        if live is None:
            return  # delivered before (cancel raced the finish) or unknown
        self._results[result.id] = (result, live.spec.kind.value)
        self.stats_book.on_finished(live.spec.kind.value, result)
        for fn in self.on_delivered:
            try:
                fn(result)
            except Exception:
                log.exception("a delivery listener failed on %s", result.id)
        for fut in self._waiters.pop(result.id, ()):
            if not fut.done():
                fut.set_result(result)
        if len(self._results) > self.config.max_results:
            self._results.popitem(last=False)

    def _expire(self) -> None:
        now = self.clock.now()
        while self._results:
            _aid, (res, _) = next(iter(self._results.items()))
            done = now if res.finish_time is None else res.finish_time  # (0.0 is a time)
            if done + self.config.result_ttl_s > now:
                break
            self._results.popitem(last=False)
        while self._idem:
            _key, (_, t) = next(iter(self._idem.items()))
            if t + self.config.idempotency_ttl_s > now:
                break
            self._idem.popitem(last=False)

    # ---- client API ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the engine is closed")
        if self._queue is None:
            raise ClosedError("the engine is not started (call start())")

    def submit_nowait(
        self, specs: ActionSpec | Sequence[ActionSpec], *, idempotency_key: str | None = None
    ) -> list[str]:
        """Enqueue actions; return their ids. Same key (and position) -> same id, run once."""
        self._check_open()
        batch = [specs] if isinstance(specs, ActionSpec) else list(specs)
        keys = [None if idempotency_key is None else
                (idempotency_key if len(batch) == 1 else f"{idempotency_key}#{i}")
                for i in range(len(batch))]
        ids: list[str | None] = [self._idem[k][0] if k is not None and k in self._idem else None
                                 for k in keys]
        fresh = [(i, s) for i, s in enumerate(batch) if ids[i] is None]
        if len(self._live) + len(fresh) > self.config.max_pending:
            self.stats_book.shed += len(fresh)
            raise Overloaded(f"{len(self._live)} actions pending (max_pending="
                             f"{self.config.max_pending}); retry later")
        seen: set[str] = set()
        for i, s in fresh:
            if s.id in self._live or s.id in self._results or s.id in seen:
                raise InvalidAction(f"actions[{i}].id", f"duplicate action id {s.id!r}")
            seen.add(s.id)
        now = self.clock.now()
        for i, s in fresh:
            self._live[s.id] = Live(s, now)
            self.stats_book.submitted[s.kind.value] += 1
            key = keys[i]
            if key is not None:
                self._idem[key] = (s.id, now)
            ids[i] = s.id
        if len(fresh) == 1:
            self._put(E.ActionArrived(now, fresh[0][1]))
        elif fresh:  # one request, one event: the core batches them together
            self._put(E.ActionsArrived(now, tuple(s for _, s in fresh)))
        return [x for x in ids if x is not None]

    async def submit(
        self, specs: ActionSpec | Sequence[ActionSpec], *, idempotency_key: str | None = None
    ) -> list[str]:
        return self.submit_nowait(specs, idempotency_key=idempotency_key)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def peek(self, action_id: str) -> ActionResult | None:
        """The result if finished and remembered, else None; UnknownAction if never seen."""
        hit = self._results.get(action_id)
        if hit is not None:
            return hit[0]
        if action_id in self._live:
            return None
        raise UnknownAction(action_id)

    def status(self, action_id: str) -> Status:
        hit = self._results.get(action_id)
        if hit is not None:
            return hit[0].status
        live = self._live.get(action_id)
        if live is None:
            raise UnknownAction(action_id)
        return Status.RUNNING if live.started else Status.QUEUED

    async def result(self, action_id: str, wait: float | None = None) -> ActionResult | None:
        """The result of an action; waits up to ``wait`` seconds (None: until it finishes).

        Returns None when it is still unfinished after the wait. UnknownAction if never seen
        (or forgotten after ``result_ttl_s``).
        """
        res = self.peek(action_id)
        if res is not None or (wait is not None and wait <= 0):
            return res
        assert self._loop is not None
        fut: asyncio.Future[ActionResult | None] = self._loop.create_future()
        self._waiters.setdefault(action_id, []).append(fut)
        # A plain future and a timer, not wait_for(shield(...)): one loop hop to wake, not three.
        timer = (self._loop.call_later(wait, _time_up, fut)
                 if wait is not None and wait < _NO_TIMER_S else None)
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            ws = self._waiters.get(action_id)
            if ws is not None and fut in ws:
                ws.remove(fut)
                if not ws:
                    del self._waiters[action_id]

    async def run(self, spec: ActionSpec, *, idempotency_key: str | None = None) -> ActionResult:
        """Submit one action and wait for its result."""
        (aid,) = self.submit_nowait(spec, idempotency_key=idempotency_key)
        res = await self.result(aid)
        assert res is not None
        return res

    async def cancel(self, action_id: str) -> bool:
        """Ask the core to cancel; False when it already finished."""
        self._check_open()
        if action_id in self._results:
            return False
        if action_id not in self._live:
            raise UnknownAction(action_id)
        self._put(E.CancelRequested(self.clock.now(), action_id))
        return True

    async def open_session(
        self, session_id: str | None = None, *, demand: Resources | None = None,
        ttl_s: float = 600.0, node: str | None = None, image: str | None = None,
        layer_mb: int | None = None, owner: str | None = None,
    ) -> str:
        """Open a session (its state lives on one node); actions naming it run there; with
        ``image``, in that environment image (a writable layer of ``layer_mb`` MiB, counted
        against ``owner``'s reservation of the node's layer budget: a tenant's name)."""
        self._check_open()
        sid = session_id or f"s-{uuid.uuid4().hex[:16]}"
        if sid in self._sessions:
            raise InvalidAction("session_id", f"session {sid!r} is already open")
        if ttl_s <= 0:
            raise InvalidAction("ttl_s", f"must be > 0, got {ttl_s}")
        if node is not None and node not in self.nodes:
            raise InvalidAction("node", f"unknown node {node!r}")
        dem = demand if demand is not None else Resources(memory_mb=256)
        self._sessions[sid] = dem
        if self._executor.reports_session_open:
            self._opening[sid] = asyncio.get_running_loop().create_future()
            while len(self._opening) > self.config.max_results:
                old, fut = next(iter(self._opening.items()))
                if not fut.done():
                    break  # (the oldest still open: kept, and so the rest)
                del self._opening[old]
        # a node already holding the image is preferred (it reports "image:NAME" warm)
        wkey = warm_key(image) if image is not None else None
        att = SessionImage(image, layer_mb, owner) if image is not None else None
        self._put(E.SessionRequested(self.clock.now(), sid, dem, ttl_s, node, warm_key=wkey,
                                     attachment=att))
        return sid

    def live_count(self) -> int:
        """Actions submitted and not finished (what `EngineConfig.max_pending` bounds)."""
        return len(self._live)

    def session_count(self) -> int:
        """Sessions open (or opening) now."""
        return len(self._sessions)

    async def close_session(self, session_id: str) -> bool:
        """Close a session; False when it is not open."""
        self._check_open()
        if session_id not in self._sessions:
            return False
        self._drop_session(session_id, f"session {session_id!r} was closed by its client",
                           remember=False)
        self._put(E.SessionClosed(self.clock.now(), session_id, "closed by client"))
        return True

    def has_session(self, session_id: str) -> bool:
        return session_id in self._sessions

    def session_gone(self, session_id: str) -> str | None:
        """Why a session that is not open is gone, where the engine knows (it expired, was
        evicted, lost with its node, or could not be opened); None otherwise."""
        return None if session_id in self._sessions else self._evicted.get(session_id)

    # ---- environment images: the executor's nodes (see `Executor.import_image`) ----------------

    async def import_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        out = await self._executor.import_image(path, name, node)
        self._imported.add(name)
        return self._sourced(out)

    def list_images(self, node: str | None = None) -> dict[str, Any]:
        return self._sourced(self._executor.list_images(node))

    async def remove_image(self, name: str, node: str | None = None) -> dict[str, Any]:
        out = await self._executor.remove_image(name, node)
        self._imported.discard(name)
        return out

    def source_of(self, name: str, path: object) -> str:
        """What an image's source is shown as (issue 35, L2: never the host path): ``upload``
        (an archive sent in `PUT /v1/images/{name}`, spooled), ``import`` (a path imported
        through this engine: `POST /v1/images`), ``config`` (anything else: the service
        config's ``images``, or the node's cache as `tangram image import` left it)."""
        if isinstance(path, str) and f"/{UPLOAD_SPOOL_PREFIX}" in path:
            return "upload"
        return "import" if name in self._imported else "config"

    def _sourced(self, listing: dict[str, Any]) -> dict[str, Any]:
        """``listing`` (an image import's answer, `list_images`, a node's info) with each
        host path of a source replaced by `source_of`."""
        out = dict(listing)
        for key in ("image_sources", "sources"):
            if isinstance(out.get(key), Mapping):
                out[key] = {n: self.source_of(str(n), p) for n, p in out[key].items()}
        if isinstance(out.get("nodes"), Mapping):
            out["nodes"] = {n: self._sourced_one(r) for n, r in out["nodes"].items()}
        if isinstance(out.get("images"), list):
            out["images"] = [self._sourced_one(r) for r in out["images"]]
        if "source" in out and "name" in out:
            out["source"] = self.source_of(str(out["name"]), out["source"])
        return out

    def _sourced_one(self, rec: Any) -> Any:
        if isinstance(rec, list):
            return [self._sourced_one(r) for r in rec]
        if isinstance(rec, dict) and "source" in rec and "name" in rec:
            return {**rec, "source": self.source_of(str(rec["name"]), rec["source"])}
        return rec

    def has_image(self, name: str) -> bool | None:
        return self._executor.has_image(name)

    def cluster_view(self) -> ClusterView:
        """The cluster as the core sees it (its nodes and instances), each node with its own
        report (`Executor.node_info`) and whether a dead model worker holds it not ready."""
        info = self._executor.node_info()
        view = self.core.view() if isinstance(self.core, Inspectable) else None
        node_views: Sequence[NodeView] = view.nodes if view is not None else ()
        instance_views: Sequence[InstanceView] = view.instances if view is not None else ()
        now = self.clock.now()
        down = {m: ModelDown(node=d.node, reason=d.reason, down_s=round(now - d.since, 3))
                for m, d in self._models_down.items()}
        nodes = []
        for nv in node_views:
            spec = self.nodes.get(nv.name)
            report = self._sourced(info.get(nv.name, {}))
            dead_here = sorted(m for m, d in down.items() if d.node == nv.name)
            why = None
            if dead_here and report.get("ready", True):  # a model's worker died here
                m = dead_here[0]
                why = (f"model {m} has no instance up: {down[m].reason} ({down[m].down_s} s "
                       "ago; reloading)")
            nodes.append(NodeRow(core=nv, report=report, not_ready_reason=why,
                                 gpu_domains=tuple(tuple(d) for d in spec.gpu_domains)
                                 if spec else ()))
        return ClusterView(nodes=tuple(nodes), policy=self.config.policy,
                           models=tuple(m.name for m in self.config.models),
                           instances=tuple(instance_views), models_down=down,
                           sessions=len(self._sessions))

    def stats(self) -> dict[str, Any]:
        """ACT percentiles per kind, queue lengths, counters (JSON-ready): `stats_view`
        rendered."""
        return self.stats_view().to_dict()

    def stats_view(self) -> StatsView:
        """ACT percentiles per kind, what waits and runs, the counters."""
        queued: dict[str, int] = {}
        running: dict[str, int] = {}
        for live in self._live.values():
            d = running if live.started else queued
            d[live.spec.kind.value] = d.get(live.spec.kind.value, 0) + 1
        sb = self.stats_book
        finished: dict[str, dict[str, int]] = {}
        for (kind, status), n in sb.finished.items():
            finished.setdefault(kind, {})[status] = n
        now = self.clock.now()
        return StatsView(
            policy=self.config.policy,
            uptime_s=round(now - self.started_at, 3) if self.started_at is not None else 0.0,
            act=sb.act_summary(), queued=queued, running=running,
            submitted=dict(sb.submitted), finished=finished,
            warm_hits=sb.warm_hits, warm_misses=sb.warm_misses,
            model_loads=sb.model_loads, model_swaps=sb.model_swaps,
            model_load_failures=sb.model_load_failures, shed=sb.shed,
            session_evictions=sb.session_evictions,
            results_kept=len(self._results), sessions=len(self._sessions),
            resizes=self._resizes(), estimator=self._estimator_errors(),
            extra={name: fn() for name, fn in self.extra_stats.items()},
        )

    def _estimator_errors(self) -> dict[str, dict[str, float]]:
        """The core's duration estimator, scored per kind: how far its predictions at arrival
        were from the work done (`DurationEstimator.errors`)."""
        return self.core.estimator.errors() if isinstance(self.core, Inspectable) else {}

    def _resizes(self) -> dict[str, int]:
        """The nodes' ResizeActions by outcome (`NodeHost.resizes`), summed; a Ray node's as of
        its last info refresh."""
        out = {"applied": 0, "deferred": 0, "dropped": 0}
        for info in self._executor.node_info().values():
            for k, n in (info.get("resizes") or {}).items():
                if k in out:
                    out[k] += int(n)
        return out
