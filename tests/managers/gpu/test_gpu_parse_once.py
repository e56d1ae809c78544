"""A GPU action's payload is parsed once (issue 36, item 3): the manager types it when the batch
arrives (`scoring.request_for`: the model's needs checked there) and sends the typed requests to
the instance's process, whose scorer reads them without parsing again. Before, the batch check
parsed each plain payload and the process parsed it a second time. A real tiny reward model."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.kinds import RetrieveRequest, ScoreRequest
from arl_tangram.managers.gpu import (
    GpuManager,
    GpuManagerConfig,
    build_tiny_models,
    tiny_model_specs,
)
from arl_tangram.managers.gpu import scoring as sc

pytestmark = pytest.mark.integration


def test_request_for_parses_once_and_checks_the_models_needs() -> None:
    rm = ModelSpec("rm", kind="scalar", path="/x")
    sim = ModelSpec("sim", kind="similarity", path="/x")
    ret = ModelSpec("ret", kind="similarity", path="/x", options={"index": "/idx"})
    got = sc.request_for(rm, {"prompt": "p", "response": "r"})
    assert got == ScoreRequest(prompt="p", response="r")
    assert sc.request_for(rm, got) is got  # typed: itself
    assert sc.request_for(ret, {"query": "q", "topk": 5}) == RetrieveRequest(query="q", topk=5)
    with pytest.raises(ValueError, match=r"^a similarity reward needs 'reference' in the payload$"):
        sc.request_for(sim, {"response": "r"})
    assert pickle.loads(pickle.dumps(got)) == got  # (it crosses to the instance's process)


def test_the_scorer_reads_a_typed_request_without_parsing_it(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    parses = []
    real = sc.score_request

    def counting(p: Any) -> ScoreRequest:
        if not isinstance(p, ScoreRequest):
            parses.append(p)
        return real(p)

    monkeypatch.setattr(sc, "score_request", counting)
    judge = ModelSpec("j", kind="judge", path="/x")
    typed = ScoreRequest(prompt="1+1?", response="2")
    assert sc.texts_for(judge, typed) == [sc.DEFAULT_JUDGE_TEMPLATE.format(
        query="Question: 1+1?\nResponse: 2")]
    assert parses == []
    sc.texts_for(judge, {"prompt": "1+1?", "response": "2"})
    assert len(parses) == 1  # (the counter counts: a plain mapping is parsed)


async def test_the_instance_process_gets_typed_requests(tmp_path: Path) -> None:
    spec = next(s for s in tiny_model_specs(build_tiny_models(tmp_path)) if s.name == "tiny-rm")
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [spec])
    sent: list[Any] = []
    call = mgr._call

    def spy(inst: Any, msg: tuple[Any, ...], timeout: float | None) -> Any:
        if msg[0] == "score":
            sent.extend(msg[1])
        return call(inst, msg, timeout)

    mgr._call = spy  # type: ignore[method-assign]
    try:
        await mgr.load("i0", spec.name, (0,))
        acts = [ActionSpec("a", kind=ActionKind.REWARD, model=spec.name,
                           payload={"query": "2+2=4"}),
                ActionSpec("b", kind=ActionKind.REWARD, model=spec.name,
                           payload=ScoreRequest(prompt="2+2=", response="4")),
                ActionSpec("bad", kind=ActionKind.REWARD, model=spec.name, payload={})]
        out = await mgr.run_batch("i0", acts)
        assert sorted(out.outputs) == ["a", "b"] and out.batch_size == 2
        assert out.failed == {"bad": "bad payload: payload needs 'query', or 'prompt' and "
                                     "'response'"}
        assert sent == [ScoreRequest(query="2+2=4"), ScoreRequest(prompt="2+2=", response="4")]
        assert all(type(r) is ScoreRequest for r in sent)
        assert sent[1] is acts[1].payload  # typed at the edge: carried, not rebuilt
    finally:
        await mgr.aclose()
