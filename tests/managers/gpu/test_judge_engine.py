"""Judge engines (issue 38) on a real vLLM server process (the CPU build, `scripts/
judge-engine.sh`), with a tiny random Qwen2 built here: generation, verdicts on real output,
continuous batching, a hung engine. One engine for the module (it starts in tens of seconds)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu.engine_judge import (
    EngineDied,
    EngineJudgeHost,
    JudgeOptions,
    engine_available,
)
from arl_tangram.managers.gpu.judge_testing import build_tiny_genjudge

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def _judge(aid: str, **payload: Any) -> ActionSpec:
    return ActionSpec(id=aid, kind=ActionKind.JUDGE, model="gj", payload=payload)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    why = engine_available()
    if why is not None:
        pytest.fail(f"{why} (`make install` installs it)")
    path = build_tiny_genjudge(tmp_path_factory.mktemp("gj") / "model")
    spec = ModelSpec("gj", kind="genjudge", path=path, max_batch=64, max_seqs=64,
                     options={"max_tokens": 24, "max_model_len": 1024, "hang_s": 10})
    host = EngineJudgeHost([spec])
    deaths: list[tuple[str, str]] = []
    host.on_worker_death = lambda iid, reason: deaths.append((iid, reason))
    loop = asyncio.new_event_loop()
    load_s = loop.run_until_complete(host.load("gj#1", "gj", (0,)))
    yield host, loop, deaths, load_s
    loop.run_until_complete(host.aclose())
    loop.run_until_complete(asyncio.sleep(0.5))  # (subprocess transports close on the loop)
    loop.close()


def test_generates_and_reports_tokens_and_the_verdict_policy_on_real_output(engine: Any) -> None:
    host, loop, deaths, load_s = engine
    assert load_s > 0 and host.events[0]["event"] == "load" and host.events[0]["instance"] == "gj#1"
    acts = [_judge(f"a{i}", prompt=f"What is {i} + {i}?", response=str(2 * i)) for i in range(6)]
    acts.append(_judge("bad", prompt=3))  # no response: a bad payload fails alone
    out = loop.run_until_complete(host.run_batch("gj#1", acts))
    assert out.failed["bad"].startswith("bad payload: payload:")
    assert sorted([*out.outputs, *out.failed]) == sorted(a.id for a in acts)
    # random weights write garbage: each judged action either has a verdict or fails naming
    # the rule and what was generated (the documented default, on_no_verdict: fail)
    for a in acts[:-1]:
        if a.id in out.outputs:
            o = out.outputs[a.id]
            assert o["model"] == "gj" and 1 <= o["completion_tokens"] <= 24
            assert o["prompt_tokens"] > 10 and isinstance(o["score"], float)
        else:
            assert out.failed[a.id].startswith("model gj: no verdict (rule boxed) in ")
            assert "generated tokens (finish_reason " in out.failed[a.id]
    # the same real output under other policies: a configured score, and a regex that matches
    passthru = _judge("p", openai={"route": "completions",
                                    "body": {"prompt": "Is 2+2=4? Answer:", "max_tokens": 16,
                                             "temperature": 0, "seed": 0}})
    got = loop.run_until_complete(host.run_batch("gj#1", [passthru])).outputs["p"]["openai"]
    assert got["object"] == "text_completion" and got["model"] == "gj"
    assert got["usage"]["completion_tokens"] == 16 and got["choices"][0]["finish_reason"] == "length"
    text = got["choices"][0]["text"]
    spec = ModelSpec("gj", kind="genjudge", path="x", options={"on_no_verdict": 0.5})
    chat = {"choices": [{"message": {"content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 16}}
    o, reason = EngineJudgeHost._verdict(spec, JudgeOptions.of(spec), "chat/completions", chat)
    assert reason == "" and o is not None
    assert (o["score"], o["verdict"], o["reasoning"], o["completion_tokens"]) == (0.5, None, text, 16)
    rx = ModelSpec("gj", kind="genjudge", path="x",
                   options={"verdict": {"rule": "regex", "pattern": r"(?s)\A(.{3})",
                                        "labels": {text[:3].lower(): 0.25}}})
    o, _ = EngineJudgeHost._verdict(rx, JudgeOptions.of(rx), "completions",
                                    {"choices": [{"text": text}], "usage": {}})
    assert o is not None and (o["score"], o["verdict"]) == (0.25, text[:3])
    # greedy with a seed: the same request gives the same text
    again = loop.run_until_complete(host.run_batch("gj#1", [passthru])).outputs["p"]["openai"]
    assert again["choices"][0]["text"] == text
    assert not deaths


def test_a_batch_joins_while_another_runs(engine: Any) -> None:
    """Continuous batching: a one-token request sent while 32 long ones run comes back first
    (an engine serving one batch at a time would answer it after them)."""
    host, loop, deaths, _ = engine

    def long(i: int) -> ActionSpec:
        return _judge(f"L{i}", openai={"route": "completions", "body": {
            "prompt": f"Question {i}:", "max_tokens": 800, "temperature": 0,
            "ignore_eos": True}})

    short = _judge("S", openai={"route": "chat/completions", "body": {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}})
    order: list[str] = []

    async def go() -> None:
        async def run(name: str, acts: list[ActionSpec]) -> Any:
            out = await host.run_batch("gj#1", acts)
            order.append(name)
            return out

        big = asyncio.create_task(run("long", [long(i) for i in range(32)]))
        while host.resident()["gj#1"]["in_flight"] < 32:
            await asyncio.sleep(0.01)
        # (800 tokens each: the 32 decode for seconds, so the margin is not a race on a slow VM)
        await asyncio.sleep(0.2)
        small = await run("short", [short])
        done = await big
        assert small.outputs["S"]["openai"]["object"] == "chat.completion"
        assert small.outputs["S"]["openai"]["usage"]["completion_tokens"] == 1
        assert all(done.outputs[f"L{i}"]["openai"]["usage"]["completion_tokens"] == 800
                   for i in range(32))

    loop.run_until_complete(go())
    assert order == ["short", "long"]
    assert not deaths


def test_step_costs_for_the_simulators_engine_model(engine: Any, monkeypatch: Any) -> None:
    """`tangram calibrate --judge-engine`'s measurement: the decode step at 1, 2, 4 and 8
    sequences at once (twice each), fitted into alpha + beta x sequences."""
    from arl_tangram.managers.gpu import engine_judge

    host, loop, deaths, _ = engine
    seen: list[list[tuple[int, float]]] = []
    fit = engine_judge.fit_alpha_beta
    monkeypatch.setattr(engine_judge, "fit_alpha_beta",
                        lambda samples, n: seen.append(list(samples)) or fit(samples, n))
    alpha, beta, s1, sk = loop.run_until_complete(host.step_costs("gj#1", k=8, tokens=16,
                                                                  repeats=2))
    (samples,) = seen
    assert [n for n, _ in samples] == [1, 2, 4, 8, 1, 2, 4, 8]
    assert (alpha, beta) == fit(samples, 2) and alpha >= 0 and beta >= 0
    # the medians of the two samples at 1 and at 8
    assert s1 == pytest.approx((samples[0][1] + samples[4][1]) / 2)
    assert sk == pytest.approx((samples[3][1] + samples[7][1]) / 2)
    with pytest.raises(BrokenError, match="repeats < 1"):
        loop.run_until_complete(host.step_costs("gj#1", k=8, tokens=16, repeats=0))
    assert not deaths


def test_a_hung_engine_is_killed_and_reported(engine: Any) -> None:
    """Last in the module: it ends the engine. SIGSTOP the engine's process group mid-batch."""
    host, loop, deaths, _ = engine
    pid = host.engine_pid("gj#1")
    assert pid is not None

    async def go() -> BaseException | None:
        task = asyncio.create_task(host.run_batch("gj#1", [_judge(
            "h", openai={"route": "completions", "body": {
                "prompt": "x", "max_tokens": 500, "ignore_eos": True}})]))
        while host.resident()["gj#1"]["in_flight"] < 1:
            await asyncio.sleep(0.01)
        os.killpg(pid, signal.SIGSTOP)
        try:
            await task
        except BaseException as exc:
            return exc
        return None

    exc = loop.run_until_complete(go())
    assert isinstance(exc, EngineDied) and exc.instance_id == "gj#1"
    assert len(deaths) == 1 and deaths[0][0] == "gj#1"
    assert "engine hung: no /health answer for" in deaths[0][1]
    assert "gj#1" not in host.resident() and host.health()["judge_engine_deaths"] == 1
    # the server and its engine-core children (one process group) were all killed
    deadline = time.monotonic() + 60
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(pid)


def _group_alive(pgid: int) -> bool:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
