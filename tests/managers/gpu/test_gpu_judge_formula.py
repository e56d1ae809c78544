"""The judge's score and the model an action names (issue 27, audit G4/G2), on real (tiny,
local) transformers models on CPU.

- A judge scores ``p_yes / (p_yes + p_no)``: the next-token probabilities of " Yes" and " No",
  renormalised over the two. Pinned on KNOWN logits: the tiny judge's output head is replaced by
  one whose weights are zero and whose bias is chosen, so every logit is known whatever the
  input (logit ln 3 for Yes, 0 elsewhere: p_yes = 3/(V+2), p_no = 1/(V+2), score 3/4).
- An action that names another model is failed by an instance and NOT scored by it: absent
  from the batch's outputs, and an error (not a score) through the dynamic batcher."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu import GpuManager, GpuManagerConfig, build_tiny_models

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny-judge"))


def _judge_with_bias(path: str, bias: dict[str, float]) -> Any:
    """A factory: the tiny judge whose logits are exactly ``bias`` (by token text, else 0)."""

    def factory() -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
        with torch.no_grad():
            head.weight.zero_()
            head.bias.zero_()
            for text, logit in bias.items():
                head.bias[tok.encode(text, add_special_tokens=False)[0]] = logit
        model.lm_head = head
        return model.eval(), tok

    return factory


def _judge_action(aid: str, model: str = "judge") -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.JUDGE, model=model,
                      payload={"prompt": "Is 2 + 2 = 4?", "response": " It is."})


@pytest.mark.parametrize(("bias", "want"), [
    ({" Yes": math.log(3.0)}, 0.75),
    ({" No": math.log(4.0)}, 0.2),
    ({}, 0.5),
    ({" Yes": 2.0, " No": 2.0, " Maybe": 5.0}, 0.5),
])
async def test_judge_score_is_p_yes_over_p_yes_plus_p_no(
        paths: dict[str, str], bias: dict[str, float], want: float) -> None:
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(paths["judge"]))
    spec = ModelSpec("judge", kind="judge", memory_mb=64)
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [spec],
                     {"judge": _judge_with_bias(paths["judge"], bias)})
    try:
        await mgr.load("j", "judge", (0,))
        out = await mgr.run_batch("j", [_judge_action("a"), _judge_action("b")])
        assert not out.failed
        z = sum(math.exp(v) for v in bias.values()) + (vocab - len(bias))
        p_yes, p_no = math.exp(bias.get(" Yes", 0.0)) / z, math.exp(bias.get(" No", 0.0)) / z
        for aid in ("a", "b"):
            o = out.outputs[aid]
            assert o["score"] == pytest.approx(want, abs=1e-5)
            assert o["p_yes"] == pytest.approx(p_yes, rel=1e-4)
            assert o["p_no"] == pytest.approx(p_no, rel=1e-4)
    finally:
        await mgr.aclose()


async def test_an_action_naming_another_model_is_not_scored(paths: dict[str, str]) -> None:
    specs = [ModelSpec("tiny-rm", kind="scalar", path=paths["scalar"], memory_mb=64),
             ModelSpec("tiny-judge", kind="judge", path=paths["judge"], memory_mb=64)]
    mgr = GpuManager(GpuManagerConfig(device="cpu"), specs)
    try:
        await mgr.load("rm", "tiny-rm", (0,))
        mine = ActionSpec("mine", kind=ActionKind.REWARD, model="tiny-rm", payload={"query": "x"})
        other = _judge_action("other", model="tiny-judge")
        out = await mgr.run_batch("rm", [mine, other])
        assert set(out.outputs) == {"mine"} and out.outputs["mine"]["model"] == "tiny-rm"
        assert set(out.failed) == {"other"} and "instance serves 'tiny-rm'" in out.failed["other"]
        assert out.batch_size == 1  # only the action of this model was run
        # through the dynamic batcher: an error, never the wrong model's score
        with pytest.raises(BrokenError, match="instance serves 'tiny-rm'"):
            await mgr.submit("rm", ActionSpec("other2", kind=ActionKind.JUDGE, model="tiny-judge",
                                              payload={"prompt": "q", "response": "r"}))
    finally:
        await mgr.aclose()


def test_paths_are_local(paths: dict[str, str]) -> None:
    assert all(Path(p).is_dir() for p in paths.values())
