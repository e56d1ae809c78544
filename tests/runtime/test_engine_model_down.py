"""The engine's models down (issue 36, item 3: one home per fact): it keeps no copy of the model
instances; on a ModelLoaded or an unsolicited ModelUnloaded it asks the core (`Core.instance`,
`Core.instances_of`), before the core handles the event. A model is down when its instance died
and the core holds no other one loaded (ready or busy), and up again once one loads."""

from __future__ import annotations

from fakes import FakeExecutor

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec, WorkHints
from arl_tangram.core.cluster import ModelSpec, NodeSpec
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.resources import Resources
from arl_tangram.core.view import InstanceView
from arl_tangram.runtime.engine import Engine, EngineConfig, make_core

RM = ModelSpec("rm", memory_mb=8000, alpha=0.04, beta=0.01, max_batch=16, max_instances=1,
               load_s=10.0, swap_s=1.0)
DIED = "the worker died: WorkerKilled"
G0 = NodeSpec("g0", Resources(cpu=16, memory_mb=65536, gpu=1, gpu_memory_mb=16000), pool="gpu")


def _engine() -> Engine:
    eng = Engine(FakeExecutor(), EngineConfig(core=CoreConfig(model_prewarm=False), models=(RM,)))
    eng.core = make_core(eng.config, [G0])
    return eng


def _load(eng: Engine, t: float, aid: str) -> C.LoadModel:
    out = eng._handle(E.ActionArrived(t, ActionSpec(aid, kind=ActionKind.REWARD, model="rm",
                                                    demand=Resources(),
                                                    hints=WorkHints(tokens=100))))
    (ld,) = [c for c in out if isinstance(c, C.LoadModel)]
    return ld


def test_a_dead_instance_marks_its_model_down_until_one_loads_again() -> None:
    eng = _engine()
    ld = _load(eng, 0.0, "a")
    eng._handle(E.ModelLoaded(1.0, ld.instance_id))
    assert (eng.stats_book.model_loads, eng._models_down) == (1, {})
    out = eng._handle(E.ModelUnloaded(2.0, ld.instance_id, False, DIED))
    down = eng._models_down["rm"]
    assert (down.node, down.reason, down.since) == ("g0", DIED, 2.0)
    (ld2,) = [c for c in out if isinstance(c, C.LoadModel)]  # (the core loads a replacement)
    eng._handle(E.ModelLoaded(3.5, ld2.instance_id, from_host=True))
    assert eng._models_down == {} and eng.model_recoveries == [1.5]
    assert (eng.stats_book.model_loads, eng.stats_book.model_swaps) == (1, 1)
    # a solicited unload (no reason) and an instance the core does not hold mark nothing
    eng._handle(E.ModelUnloaded(4.0, "nobody", False, DIED))
    eng._handle(E.ModelUnloaded(4.0, ld2.instance_id, True))
    assert eng._models_down == {}


def test_a_model_with_another_loaded_instance_is_not_down() -> None:
    eng = _engine()
    ld = _load(eng, 0.0, "a")
    other = InstanceView("other", "rm", "g0", (0,), "ready", 0)
    eng._model_died(other, DIED, 0.5)  # the core's one instance is still loading: down
    assert eng._models_down["rm"].since == 0.5
    eng._handle(E.ModelLoaded(1.0, ld.instance_id))
    assert eng._models_down == {} and eng.model_recoveries == [0.5]
    eng._model_died(other, DIED, 2.0)  # the core's one is loaded (busy): not down
    assert eng._models_down == {}
    mine = eng._instance(ld.instance_id)
    assert mine == InstanceView(ld.instance_id, "rm", "g0", ld.devices, "busy", 1)  # (its batch)
    eng._model_died(mine, DIED, 3.0)  # itself does not count: down
    eng._model_died(other, "again", 4.0)  # (down already: the first death kept)
    assert (eng._models_down["rm"].reason, eng._models_down["rm"].since) == (DIED, 3.0)


def test_a_failed_load_is_counted_and_a_core_that_shows_nothing_is_asked_nothing() -> None:
    eng = _engine()
    ld = _load(eng, 0.0, "a")
    eng._handle(E.ModelLoaded(1.0, ld.instance_id, ok=False, reason="no memory"))
    assert (eng.stats_book.model_load_failures, eng.stats_book.model_loads) == (1, 0)
    eng.core = object()  # type: ignore[assignment]  # (a scheduler that is not Inspectable)
    assert eng._instance(ld.instance_id) is None
    eng._model_died(InstanceView("i", "rm", "g0", (), "ready", 0), DIED, 2.0)
    assert eng._models_down["rm"].node == "g0"
