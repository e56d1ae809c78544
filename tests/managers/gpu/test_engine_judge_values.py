"""The judge engine host's own logic with exact values (issue 43): options and their errors, the
prompt and the request body, the engine's command line and environment, start, sleep / wake,
batches, verdicts, step costs, supervision (an engine that exits, hangs or fails a request), the
reports and the log directory.

No vLLM: the engine process is a real ``sleep`` in its own process group (its command and
environment recorded as vLLM's would be), and its OpenAI-compatible API a stand-in answering
through ``httpx.MockTransport`` (`_Api`: each request recorded with its timeout). Quick: no
model, no interpreter started."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.kinds import Completion, JudgeRequest, JudgeVerdict
from arl_tangram.managers.gpu import engine_judge as ej
from arl_tangram.managers.gpu.config import BatchOutcome
from arl_tangram.managers.gpu.engine_judge import (
    DEFAULT_TEMPLATE,
    EngineDied,
    EngineJudgeHost,
    JudgeOptions,
    engine_available,
    engine_python,
    judge_messages,
)
from arl_tangram.managers.gpu.verdict import VerdictRule

Handler = Callable[[httpx.Request], Any]

CHAT = {
    "choices": [{"message": {"content": "fine \\boxed{yes}"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3},
}
TEXT = {
    "choices": [{"text": "hm \\boxed{no}", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 4},
}


class _Api:
    """The engine's HTTP API: scripted answers by path; every request recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], Any, Any]] = []
        self.routes: dict[str, Handler] = {
            "/health": lambda r: httpx.Response(200),
            "/v1/chat/completions": lambda r: httpx.Response(200, json=CHAT),
            "/v1/completions": lambda r: httpx.Response(200, json=TEXT),
            "/sleep": lambda r: httpx.Response(200, json={"status": "sleeping"}),
            "/wake_up": lambda r: httpx.Response(200, json={"status": "awake"}),
        }

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = None
        if request.content:
            import json

            body = json.loads(request.content)
        self.seen.append(
            (
                request.method,
                request.url.path,
                dict(request.url.params),
                body,
                request.extensions.get("timeout"),
            )
        )
        got = self.routes[request.url.path](request)
        if asyncio.iscoroutine(got):
            got = await got
        return got

    def paths(self) -> list[str]:
        return [p for _, p, _, _, _ in self.seen]


class _Launch:
    """asyncio.create_subprocess_exec for the engine: records vLLM's argv and keywords, starts
    ``cmd`` (a real process, in its own session as the engine's would be) instead."""

    def __init__(self) -> None:
        self.runs: list[tuple[list[str], dict[str, Any]]] = []
        self.cmd = ["sleep", "30"]  # (ends by itself should a test leave it)
        self.procs: list[asyncio.subprocess.Process] = []
        self.real = asyncio.create_subprocess_exec

    async def __call__(self, *argv: str, **kw: Any) -> asyncio.subprocess.Process:
        self.runs.append((list(argv), kw))
        proc = await self.real(*self.cmd, **kw)
        self.procs.append(proc)
        return proc


class _Proxy:
    """A module as engine_judge sees it, some names replaced (its clock, the watch loop's
    one-second pause): the event loop and httpx keep the real ones."""

    def __init__(self, module: Any, **names: Any) -> None:
        self._module = module
        self.__dict__.update(names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> _Api:
    api = _Api()
    real = httpx.AsyncClient
    made: list[dict[str, Any]] = []

    def client(**kw: Any) -> httpx.AsyncClient:
        made.append(kw)
        return real(transport=httpx.MockTransport(api), **kw)

    monkeypatch.setattr(httpx, "AsyncClient", client)
    api.clients = made  # type: ignore[attr-defined]
    return api


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> _Launch:
    la = _Launch()
    monkeypatch.setattr(asyncio, "create_subprocess_exec", la)
    return la


def _spec(name: str = "gj", **kw: Any) -> ModelSpec:
    kw.setdefault("path", "/models/gj")
    return ModelSpec(name, kind="genjudge", **kw)


def _host(tmp_path: Path, *specs: ModelSpec, **kw: Any) -> EngineJudgeHost:
    kw.setdefault("python", "/venv/bin/python3")
    kw.setdefault("log_dir", str(tmp_path))
    return EngineJudgeHost(list(specs) or [_spec()], **kw)


@contextlib.asynccontextmanager
async def _loaded(tmp_path: Path) -> AsyncIterator[EngineJudgeHost]:
    """A host of the one judge, ``gj#1`` loaded on device 0, closed after."""
    host = _host(tmp_path)
    try:
        await host.load("gj#1", "gj", (0,))
        yield host
    finally:
        await host.aclose()


def _act(aid: str, model: str | None = "gj", **payload: Any) -> ActionSpec:
    return ActionSpec(
        aid,
        kind=ActionKind.JUDGE,
        model=model,
        payload=payload or {"prompt": "1+1?", "response": "2"},
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


# ---- options --------------------------------------------------------------------------------


def test_the_default_options_and_template() -> None:
    o = JudgeOptions()
    assert (
        o.engine,
        o.template,
        o.chat_template,
        o.system,
        o.max_tokens,
        o.temperature,
        o.seed,
        o.verdict,
        o.on_no_verdict,
        o.max_model_len,
        o.kv_cache_gb,
        o.start_timeout_s,
        o.hang_s,
        o.request_timeout_s,
        o.extra_args,
    ) == (
        "vllm",
        DEFAULT_TEMPLATE,
        True,
        None,
        256,
        0.0,
        0,
        VerdictRule(),
        "fail",
        4096,
        1.0,
        600.0,
        30.0,
        600.0,
        (),
    )
    assert DEFAULT_TEMPLATE.format(prompt="P", response="R") == (
        "Question:\nP\n\nResponse:\nR\n\nIs the response correct? Think briefly, then give your "
        "final answer as \\boxed{yes} or \\boxed{no}."
    )
    assert JudgeOptions.of(_spec()) == o


def test_every_option_is_read() -> None:
    o = JudgeOptions.of(
        _spec(
            options={
                "engine": "vllm",
                "template": 5,
                "system": 7,
                "chat_template": 0,
                "max_tokens": "9",
                "max_model_len": 10.0,
                "temperature": "0.5",
                "kv_cache_gb": 2,
                "start_timeout_s": 3,
                "hang_s": 0,
                "request_timeout_s": 4,
                "seed": "12",
                "verdict": "json",
                "on_no_verdict": "0.25",
                "extra_args": ["--a", 1],
            }
        )
    )
    assert o == JudgeOptions(
        template="5",
        system="7",
        chat_template=False,
        max_tokens=9,
        max_model_len=10,
        temperature=0.5,
        kv_cache_gb=2.0,
        start_timeout_s=3.0,
        hang_s=0.0,
        request_timeout_s=4.0,
        seed=12,
        verdict=VerdictRule.from_options("json"),
        on_no_verdict=0.25,
        extra_args=("--a", "1"),
    )
    assert type(o.max_tokens) is int and type(o.max_model_len) is int and type(o.seed) is int
    assert type(o.temperature) is float and type(o.on_no_verdict) is float
    assert type(o.hang_s) is float and type(o.kv_cache_gb) is float
    o = JudgeOptions.of(
        _spec(
            options={
                "template": None,
                "system": None,
                "seed": None,
                "on_no_verdict": "fail",
                "chat_template": 1,
                "max_tokens": 1,
                "max_model_len": 2,
            }
        )
    )
    assert (o.template, o.system, o.seed, o.on_no_verdict, o.chat_template) == (
        None,
        None,
        None,
        "fail",
        True,
    )
    assert JudgeOptions.of(_spec(options={"on_no_verdict": 0})).on_no_verdict == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temprature": 0, "zeta": 1}, "model gj: options.temprature: unknown option"),
        ({"engine": "sglang"}, "model gj: options.engine: only 'vllm' is supported"),
        ({"max_tokens": 0}, "model gj: options.max_tokens: must be >= 1"),
        ({"max_model_len": 0}, "model gj: options.max_model_len: must be >= 1"),
        (
            {"max_tokens": "many"},
            "model gj: options: invalid literal for int() with base 10: 'many'",
        ),
        ({"temperature": -0.5}, "model gj: options.temperature: must be finite and >= 0"),
        ({"kv_cache_gb": math.inf}, "model gj: options.kv_cache_gb: must be finite and >= 0"),
        (
            {"start_timeout_s": math.nan},
            "model gj: options.start_timeout_s: must be finite and >= 0",
        ),
        ({"hang_s": -1}, "model gj: options.hang_s: must be finite and >= 0"),
        ({"request_timeout_s": -1}, "model gj: options.request_timeout_s: must be finite and >= 0"),
        ({"on_no_verdict": math.inf}, "model gj: options.on_no_verdict: 'fail' or a finite score"),
        ({"on_no_verdict": "nan"}, "model gj: options.on_no_verdict: 'fail' or a finite score"),
        ({"on_no_verdict": "skip"}, "model gj: options: could not convert string to float: 'skip'"),
        ({"verdict": {"rule": "boxed", "x": 1}}, "model gj: verdict.x: unknown field"),
        ({"seed": "s"}, "model gj: options: invalid literal for int() with base 10: 's'"),
        (
            {"max_tokens": 4096},
            "model gj: options.max_tokens (4096) must be below options.max_model_len (4096)",
        ),
        (
            {"max_tokens": 8, "max_model_len": 8},
            "model gj: options.max_tokens (8) must be below options.max_model_len (8)",
        ),
    ],
)
def test_bad_options_are_named_exactly(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as e:
        JudgeOptions.of(_spec(options=options))
    assert str(e.value) == message
    assert e.value.__cause__ is None


def test_edges_of_the_options_that_are_allowed() -> None:
    o = JudgeOptions.of(
        _spec(
            options={
                "max_tokens": 4095,
                "temperature": 0,
                "kv_cache_gb": 0,
                "start_timeout_s": 0,
                "request_timeout_s": 0,
            }
        )
    )
    assert (o.max_tokens, o.temperature, o.kv_cache_gb) == (4095, 0.0, 0.0)
    assert (o.start_timeout_s, o.request_timeout_s) == (0.0, 0.0)


# ---- the engine's interpreter ---------------------------------------------------------------


def test_engine_python_and_availability(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ARL_TANGRAM_JUDGE_PYTHON", raising=False)
    assert engine_python() == str(Path(sys.prefix) / "engines" / "vllm" / "bin" / "python")
    monkeypatch.setenv("ARL_TANGRAM_JUDGE_PYTHON", "")
    assert engine_python() == str(Path(sys.prefix) / "engines" / "vllm" / "bin" / "python")
    missing = tmp_path / "python"
    monkeypatch.setenv("ARL_TANGRAM_JUDGE_PYTHON", str(missing))
    assert engine_python() == str(missing)
    assert engine_available() == (
        f"judge engine not installed ({missing} missing: run scripts/judge-engine.sh)"
    )
    missing.write_text("")
    assert engine_available() is not None  # (not executable)
    missing.chmod(0o755)
    assert engine_available() is None
    assert EngineJudgeHost([]).python == str(missing)


async def test_a_load_checks_the_default_interpreter_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    monkeypatch.setenv("ARL_TANGRAM_JUDGE_PYTHON", str(tmp_path / "nope"))
    host = EngineJudgeHost([_spec()], log_dir=str(tmp_path))
    with pytest.raises(BrokenError) as e:
        await host.load("gj#1", "gj", (0,))
    assert str(e.value) == (
        f"judge engine not installed ({tmp_path / 'nope'} missing: run scripts/judge-engine.sh)"
    )
    assert launch.runs == [] and host._engines == {}
    other = _host(tmp_path)  # (an interpreter named by the caller is the caller's)
    try:
        await other.load("gj#1", "gj", (0,))
        assert launch.runs[0][0][0] == "/venv/bin/python3"
    finally:
        await other.aclose()


# ---- the prompt and the request -------------------------------------------------------------


def test_judge_messages_forms() -> None:
    spec = _spec(options={"template": "<{prompt}|{response}|{query}>", "system": "S"})
    o = JudgeOptions.of(spec)
    assert judge_messages(spec, o, {"prompt": "p", "response": "r"}) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "<p|r|r>"},
    ]
    assert judge_messages(spec, o, {"response": "r"}) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "<|r|r>"},
    ]
    assert judge_messages(spec, o, {"query": "q"}) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "<|q|q>"},
    ]
    msgs = {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]}
    assert judge_messages(spec, o, msgs) == msgs["messages"]
    plain = _spec(
        options={"template": "<{prompt}|{response}>", "chat_template": False, "system": "ignored"}
    )
    po = JudgeOptions.of(plain)
    assert judge_messages(plain, po, msgs) == "a\nb"
    assert judge_messages(plain, po, {"prompt": "p", "response": "r"}) == "<p|r>"
    nosys = _spec(options={"template": "{response}", "system": ""})
    assert judge_messages(nosys, JudgeOptions.of(nosys), {"query": "q"}) == [
        {"role": "user", "content": "q"}
    ]
    # a completion's prompt (a list) is not a chat prompt: the template's {prompt} is ""
    req = JudgeRequest(prompt=("a", "b"), response="r")
    assert judge_messages(nosys, JudgeOptions.of(nosys), req) == [{"role": "user", "content": "r"}]
    assert judge_messages(plain, po, req) == "<|r>"
    assert judge_messages(plain, po, {"query": ""}) == "<|>"


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{nope}", "KeyError('nope')"),
        ("{0}", "IndexError('Replacement index 0 out of range for positional args tuple')"),
        ("{", "ValueError(\"Single '{' encountered in format string\")"),
    ],
)
def test_a_bad_template_is_named(template: str, error: str) -> None:
    spec = _spec(options={"template": template})
    with pytest.raises(ValueError) as e:
        judge_messages(spec, JudgeOptions.of(spec), {"query": "q"})
    assert str(e.value) == f"options.template of model gj: {error}"
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_the_request_body() -> None:
    host = EngineJudgeHost([])
    spec = _spec(options={"template": "{response}", "max_tokens": 5, "temperature": 0.5, "seed": 3})
    o = JudgeOptions.of(spec)
    assert host._judge_request(spec, o, JudgeRequest(query="q")) == (
        "chat/completions",
        {
            "model": "gj",
            "max_tokens": 5,
            "temperature": 0.5,
            "seed": 3,
            "messages": [{"role": "user", "content": "q"}],
        },
    )
    plain = _spec(options={"template": "{response}", "chat_template": False, "seed": None})
    assert host._judge_request(plain, JudgeOptions.of(plain), JudgeRequest(query="q")) == (
        "completions",
        {"model": "gj", "max_tokens": 256, "temperature": 0.0, "prompt": "q"},
    )


# ---- verdicts -------------------------------------------------------------------------------


def test_a_verdict_read_from_a_chat_and_from_a_completion() -> None:
    spec = _spec()
    o = JudgeOptions.of(spec)
    v, why = EngineJudgeHost._verdict(spec, o, "chat/completions", CHAT)
    assert why == "" and v == JudgeVerdict(
        model="gj",
        reasoning="fine \\boxed{yes}",
        prompt_tokens=11,
        completion_tokens=3,
        finish_reason="stop",
        score=1.0,
        verdict="yes",
    )
    v, why = EngineJudgeHost._verdict(spec, o, "completions", TEXT)
    assert why == "" and v == JudgeVerdict(
        model="gj",
        reasoning="hm \\boxed{no}",
        prompt_tokens=7,
        completion_tokens=4,
        finish_reason="length",
        score=0.0,
        verdict="no",
    )
    # a completion read as a chat finds no message; empty answers
    v, why = EngineJudgeHost._verdict(spec, o, "chat/completions", TEXT)
    assert v is None and why == (
        "model gj: no verdict (rule boxed) in 4 generated tokens (finish_reason length): ...''"
    )
    for data in (
        {},
        {"choices": [], "usage": None},
        {"choices": [{"message": None}]},
        {"choices": [{"message": {"content": None}}], "usage": {"prompt_tokens": None}},
    ):
        v, why = EngineJudgeHost._verdict(spec, o, "chat/completions", data)
        assert v is None and why == (
            "model gj: no verdict (rule boxed) in 0 generated tokens (finish_reason None): ...''"
        )


def test_no_verdict_shows_the_last_120_characters_on_one_line() -> None:
    spec = _spec()
    text = "a" * 10 + "\n" + "b" * 130
    v, why = EngineJudgeHost._verdict(
        spec,
        JudgeOptions.of(spec),
        "completions",
        {"choices": [{"text": text}], "usage": {"completion_tokens": "9"}},
    )
    shown = ("b" * 120).replace("\n", "\\n")
    assert v is None and why == (
        f"model gj: no verdict (rule boxed) in 9 generated tokens "
        f"(finish_reason None): ...{shown!r}"
    )
    text = "x" * 100 + "\nend"
    _, why = EngineJudgeHost._verdict(
        spec, JudgeOptions.of(spec), "completions", {"choices": [{"text": text}]}
    )
    assert why.endswith("..." + repr(("x" * 100 + "\nend")[-120:].replace("\n", "\\n")))
    assert "\\\\n" in why
    lenient = _spec(options={"on_no_verdict": -2, "verdict": "json"})
    v, why = EngineJudgeHost._verdict(
        lenient, JudgeOptions.of(lenient), "completions", {"choices": [{"text": "none"}]}
    )
    assert why == "" and v == JudgeVerdict(
        model="gj",
        reasoning="none",
        prompt_tokens=0,
        completion_tokens=0,
        finish_reason=None,
        score=-2.0,
        verdict=None,
    )


# ---- the engine's command line and environment -----------------------------------------------


def test_the_command_line_on_cpu_and_on_cuda(tmp_path: Path) -> None:
    spec = _spec(
        max_batch=16,
        dtype="bfloat16",
        options={
            "max_model_len": 512,
            "max_tokens": 8,
            "kv_cache_gb": 1.5,
            "extra_args": ["--seed", 3],
        },
    )
    cpu = _host(tmp_path, spec)
    eng = ej._Engine("gj#1", spec, cpu._opts["gj"], (0,), port=8123)
    common = [
        "/venv/bin/python3",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/gj",
        "--served-model-name",
        "gj",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "16",
        "--dtype",
        "bfloat16",
        "--disable-log-stats",
        "--uvicorn-log-level",
        "warning",
    ]
    assert cpu._argv(eng) == [
        *common,
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        "--seed",
        "3",
    ]
    cuda = _host(tmp_path, spec, device="cuda")
    assert cuda._argv(eng) == [
        *common,
        "--kv-cache-memory-bytes",
        str(int(1.5 * (1 << 30))),
        "--enable-sleep-mode",
        "--seed",
        "3",
    ]
    nosleep = _host(tmp_path, spec, device="cuda", sleep_level=0)
    assert nosleep._argv(eng) == [*common, "--kv-cache-memory-bytes", "1610612736", "--seed", "3"]
    cpu_sleep = _host(tmp_path, spec, device="cpu", sleep_level=2)
    assert cpu_sleep._argv(eng)[-4:] == ["uni", "--enable-sleep-mode", "--seed", "3"]
    for dtype, shown in (
        ("float32", "float32"),
        ("float16", "float16"),
        ("int8", "auto"),
        ("auto", "auto"),
    ):
        s = _spec(dtype=dtype, max_seqs=5, max_batch=9)
        e = ej._Engine("x", s, JudgeOptions.of(s), (0,))
        argv = cpu._argv(e)
        assert argv[argv.index("--dtype") + 1] == shown
        assert argv[argv.index("--max-num-seqs") + 1] == "5"
        assert argv[argv.index("--port") + 1] == "0"


async def test_a_start_on_cpu(
    tmp_path: Path,
    api: _Api,
    launch: _Launch,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ej.__name__)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "keep")
    monkeypatch.delenv("VLLM_DO_NOT_TRACK", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    host = _host(tmp_path, _spec(options={"kv_cache_gb": 2.5, "request_timeout_s": 42}))
    try:
        secs = await host.load("gj#1", "gj", [0])  # type: ignore[arg-type]
        eng = host._engines["gj#1"]
        ((argv, kw),) = launch.runs
        assert argv == host._argv(eng) and argv[argv.index("--port") + 1] == str(eng.port)
        assert 1024 <= eng.port < 65536 and eng.port != 0
        env = kw["env"]
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_NO_USAGE_STATS"] == "keep"
        assert env["VLLM_DO_NOT_TRACK"] == "1" and env["HF_HUB_OFFLINE"] == "1"
        assert "VLLM_SERVER_DEV_MODE" not in env and "CUDA_VISIBLE_DEVICES" not in env
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert env["PATH"] == os.environ["PATH"]
        assert kw["stdin"] == asyncio.subprocess.DEVNULL
        assert kw["stderr"] == asyncio.subprocess.STDOUT and kw["start_new_session"] is True
        assert kw["stdout"].name == str(tmp_path / "gj#1.log") and kw["stdout"].mode == "ab"
        assert eng.log_path == str(tmp_path / "gj#1.log")
        (ckw,) = api.clients  # type: ignore[attr-defined]
        assert ckw["base_url"] == f"http://127.0.0.1:{eng.port}"
        assert ckw["timeout"] == httpx.Timeout(42.0, connect=10.0)
        assert ckw["limits"] == httpx.Limits(max_connections=None, max_keepalive_connections=64)
        assert api.seen[0][:3] == ("GET", "/health", {})
        assert api.seen[0][4] == {"connect": 2.0, "read": 2.0, "write": 2.0, "pool": 2.0}
        assert os.getpgid(eng.proc.pid) == eng.proc.pid  # type: ignore[union-attr]
        assert secs == eng.load_s and 0 < secs < 5
        assert f"judge engine gj#1 (gj) up in {secs:.1f}s on port {eng.port}" in caplog.messages
        assert host.events == [
            {
                "event": "load",
                "instance": "gj#1",
                "model": "gj",
                "seconds": secs,
                "from_host": False,
            }
        ]
        assert host.resident() == {
            "gj#1": {
                "model": "gj",
                "devices": (0,),
                "state": "loaded",
                "from_host": False,
                "load_s": secs,
                "engine": "vllm",
                "pid": eng.proc.pid,  # type: ignore[union-attr]
                "in_flight": 0,
            }
        }
        assert host.engine_pid("gj#1") == eng.proc.pid and host.engine_pid("x") is None  # type: ignore[union-attr]
        assert host.base_url("gj#1") == f"http://127.0.0.1:{eng.port}"
        assert host.base_url("x") is None
        assert eng.watch is not None and eng.watch.get_name() == "judge-watch-gj#1"
        assert host.serves("gj") and not host.serves("x")
    finally:
        await host.aclose()


async def test_a_start_on_cuda(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.delenv("VLLM_NO_USAGE_STATS", raising=False)
    monkeypatch.setenv("VLLM_DO_NOT_TRACK", "keep")
    host = _host(tmp_path, _spec(options={"kv_cache_gb": 0.2}), device="cuda")
    try:
        await host.load("gj#1", "gj", (2, 0))
        env = launch.runs[0][1]["env"]
        assert env["VLLM_NO_USAGE_STATS"] == "1" and env["VLLM_DO_NOT_TRACK"] == "keep"
        assert "XXVLLM_NO_USAGE_STATSXX" not in env and "vllm_no_usage_stats" not in env
        assert env["CUDA_VISIBLE_DEVICES"] == "2,0" and env["VLLM_SERVER_DEV_MODE"] == "1"
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    finally:
        await host.aclose()


async def test_a_start_waits_for_health(tmp_path: Path, api: _Api, launch: _Launch) -> None:
    answers = iter([httpx.ConnectError("refused"), 503, 200])

    def health(r: httpx.Request) -> httpx.Response:
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return httpx.Response(a)

    api.routes["/health"] = health
    async with _loaded(tmp_path) as host:
        assert api.paths() == ["/health"] * 3
        assert 0.5 <= host._engines["gj#1"].load_s < 2.0  # (two waits of 0.25 s)


async def test_a_start_that_never_answers_times_out_with_the_logs_tail(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    api.routes["/health"] = lambda r: httpx.Response(503)
    (tmp_path / "gj#1.log").write_text("loading\nValueError: bad config\nmore\n")
    host = _host(tmp_path, _spec(options={"start_timeout_s": 0.3}))
    try:
        with pytest.raises(BrokenError) as e:
            await host.load("gj#1", "gj", (0,))
        assert str(e.value) == (
            "judge engine gj#1 did not answer within 0.3s: ValueError: bad config"
        )
        assert host._engines == {} and host.events == []
        assert launch.procs[0].returncode == -signal.SIGKILL  # (ended at once)
    finally:
        await host.aclose()


async def test_an_engine_that_exits_while_starting(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    api.routes["/health"] = lambda r: httpx.Response(503)
    launch.cmd = ["sh", "-c", "echo one; echo 'an error here'; echo two; exit 3"]
    host = _host(tmp_path, _spec(options={"start_timeout_s": 30}))
    try:
        with pytest.raises(BrokenError) as e:
            await host.load("gj#1", "gj", (0,))
        assert str(e.value) == "judge engine gj#1 (gj) exited with 3 while starting: an error here"
        assert host._engines == {}
    finally:
        await host.aclose()


def test_the_tail_of_a_log(tmp_path: Path) -> None:
    p = tmp_path / "log"
    assert ej._tail(str(p)) == ""
    p.write_text("\n".join(f"line {i}" for i in range(20)))
    assert ej._tail(str(p)) == "\n".join(f"line {i}" for i in range(8, 20))
    assert ej._tail(str(p), 2) == "line 18\nline 19"
    p.write_text("a\nError: x\nb\nan error: y\nc\n" + "\n".join(f"Error {i}" for i in range(14)))
    assert ej._tail(str(p)) == "\n".join(f"Error {i}" for i in range(2, 14))
    assert ej._tail(str(p), 20) == "Error: x\nan error: y\n" + "\n".join(
        f"Error {i}" for i in range(14)
    )
    p.write_bytes(b"\xff bad Error\n")
    assert ej._tail(str(p)) == "\ufffd bad Error"


def test_a_free_port() -> None:
    port = ej._free_port()
    assert isinstance(port, int) and 1024 <= port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


async def test_a_model_without_a_path_and_other_refusals(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, _spec(path=None))
    with pytest.raises(BrokenError) as e:
        await host.load("gj#1", "gj", (0,))
    assert str(e.value) == "model gj: a judge engine needs a path"
    assert host._engines == {} and launch.runs == []
    with pytest.raises(BrokenError) as e:
        await host.load("gj#1", "other", (0,))
    assert str(e.value) == "model 'other' is not a judge engine here"
    await host.aclose()
    with pytest.raises(ClosedError) as ce:
        await host.load("gj#1", "gj", (0,))
    assert str(ce.value) == "the judge engine host is closed"
    with pytest.raises(ClosedError) as ce:
        await host.run_batch("gj#1", [])
    assert str(ce.value) == "the judge engine host is closed"


async def test_a_second_load_of_an_instance_and_unloaded_while_loading(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    gate = asyncio.Event()

    async def slow(r: httpx.Request) -> httpx.Response:
        await gate.wait()
        return httpx.Response(200)

    api.routes["/health"] = slow
    host = _host(tmp_path)
    try:
        task = asyncio.create_task(host.load("gj#1", "gj", (0,)))
        while not launch.runs or not api.seen:
            await asyncio.sleep(0.01)
        with pytest.raises(BrokenError) as e:
            await host.load("gj#1", "gj", (0,))
        assert str(e.value) == "instance gj#1 already exists"
        assert host.resident()["gj#1"]["state"] == "loading"
        assert await host.unload("gj#1") is False
        gate.set()
        with pytest.raises(BrokenError) as e:
            await task
        assert str(e.value) == "instance gj#1 was unloaded while it was loading"
        assert host._engines == {}
    finally:
        gate.set()
        await host.aclose()


async def test_unloaded_and_loaded_again_while_loading(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    gate = asyncio.Event()
    first = True

    async def slow(r: httpx.Request) -> httpx.Response:
        nonlocal first
        if first:
            first = False
            await gate.wait()
        return httpx.Response(200)

    api.routes["/health"] = slow
    host = _host(tmp_path)
    try:
        task = asyncio.create_task(host.load("gj#1", "gj", (0,)))
        while not api.seen:
            await asyncio.sleep(0.01)
        old = host._engines["gj#1"]
        assert await host.unload("gj#1") is False
        await host.load("gj#1", "gj", (0,))  # (a new engine under the same id)
        new = host._engines["gj#1"]
        gate.set()
        with pytest.raises(BrokenError) as e:
            await task
        assert str(e.value) == "instance gj#1 was unloaded while it was loading"
        assert host._engines == {"gj#1": new} and old.proc is not None
        assert old.proc.returncode is not None
    finally:
        gate.set()
        await host.aclose()


# ---- unload, sleep and wake -------------------------------------------------------------------


async def test_unload_ends_the_process_group_and_records_the_event(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    async with _loaded(tmp_path) as host:
        eng = host._engines["gj#1"]
        pid = eng.proc.pid  # type: ignore[union-attr]
        assert await host.unload("gj#1", park=True) is False  # (CPU: nothing sleeps)
        assert eng.proc.returncode == -signal.SIGTERM  # type: ignore[union-attr]
        assert eng.state == "stopping" and eng.watch is not None and eng.watch.cancelled()
        assert eng.client is not None and eng.client.is_closed
        ev = host.events[-1]
        assert ev == {
            "event": "unload",
            "instance": "gj#1",
            "model": "gj",
            "seconds": ev["seconds"],
            "parked": False,
            "pid": pid,
        }
        assert 0 <= ev["seconds"] < 5 and host.resident() == {}
        assert await host.unload("gj#1") is False and len(host.events) == 2
        assert "/sleep" not in api.paths()


async def test_stop_kills_at_once_when_told(tmp_path: Path, api: _Api, launch: _Launch) -> None:
    async with _loaded(tmp_path) as host:
        eng = host._engines.pop("gj#1")
        eng.watch.cancel()  # type: ignore[union-attr]
        await host._stop(eng, kill=True)
        assert eng.proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]
        await host._stop(eng)  # (again: already ended)
        await host._stop(ej._Engine("x", _spec(), JudgeOptions(), (0,)))  # (no process)


async def test_stop_kills_what_ignores_sigterm_after_its_grace(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready = tmp_path / "ready"
    launch.cmd = [
        "sh",
        "-c",
        f"trap '' TERM; touch {ready}; for i in $(seq 400); do sleep 0.05; done",
    ]
    host = _host(tmp_path)
    graces: list[float] = []

    async def wait_for(aw: Any, timeout: float) -> Any:  # (the grace, shortened)
        graces.append(timeout)
        return await asyncio.wait_for(aw, 0.3)

    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines.pop("gj#1")
        eng.watch.cancel()  # type: ignore[union-attr]
        while not ready.exists():
            await asyncio.sleep(0.01)
        monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait_for=wait_for))
        await host._stop(eng)
        monkeypatch.setattr(ej, "asyncio", asyncio)
        assert graces == [10.0] and eng.proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]
    finally:
        monkeypatch.setattr(ej, "asyncio", asyncio)
        await host.aclose()


async def test_stop_kills_the_engines_children_too(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    child = tmp_path / "child"
    launch.cmd = ["sh", "-c", f"sleep 30 & echo $! > {child}; trap 'exit 0' TERM; wait"]
    async with _loaded(tmp_path) as host:
        for _ in range(200):
            if child.exists() and child.read_text().strip():
                break
            await asyncio.sleep(0.01)
        kid = int(child.read_text())
        await host.unload("gj#1", park=False)
        for _ in range(200):
            if _gone(kid):
                break
            await asyncio.sleep(0.01)
        assert _gone(kid)


async def test_sleep_and_wake_with_exact_requests_and_events(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, _spec(options={"start_timeout_s": 77}), device="cuda", sleep_level=2)
    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        assert await host.unload("gj#1") is True
        assert api.seen[-1][:4] == ("POST", "/sleep", {"level": "2"}, None)
        assert api.seen[-1][4]["read"] == 120.0
        assert eng.state == "asleep" and eng.watch is None and host._asleep == {"gj#1": eng}
        ev = host.events[-1]
        assert (
            ev
            == {
                "event": "sleep",
                "instance": "gj#1",
                "model": "gj",
                "seconds": ev["seconds"],
                "level": 2,
            }
            and 0 <= ev["seconds"] < 5
        )
        assert eng.proc.returncode is None  # type: ignore[union-attr]
        secs = await host.load("gj#2", "gj", (0,), from_host=True)
        assert 0 <= secs < 5
        assert api.seen[-1][:4] == ("POST", "/wake_up", {}, None)
        assert api.seen[-1][4]["read"] == 77.0
        assert host._engines == {"gj#2": eng} and host._asleep == {}
        assert (eng.id, eng.state, eng.from_host, eng.load_s) == ("gj#2", "loaded", True, secs)
        assert host.events[-1] == {
            "event": "wake",
            "instance": "gj#2",
            "model": "gj",
            "seconds": secs,
            "from_host": True,
        }
        assert eng.watch is not None and eng.watch.get_name() == "judge-watch-gj#2"
        await asyncio.sleep(0.05)
        assert not eng.watch.done()  # (the woken engine is watched again)
        assert len(launch.runs) == 1
    finally:
        await host.aclose()


async def test_what_is_not_put_to_sleep(tmp_path: Path, api: _Api, launch: _Launch) -> None:
    host = _host(tmp_path, device="cuda")
    try:
        await host.load("gj#1", "gj", (0,))
        assert await host.unload("gj#1", park=False) is False
        await host.load("gj#2", "gj", (0,))
        host._engines["gj#2"].dead = "x"
        assert await host.unload("gj#2") is False
        await host.load("gj#3", "gj", (0,))
        eng = host._engines["gj#3"]
        eng.state = "loading"
        assert await host._sleep(eng) is False
        eng.state = "loaded"
        client, eng.client = eng.client, None
        assert await host._sleep(eng) is False
        eng.client = client
        eng.in_flight = 2
        assert await host._sleep(eng) is False
        assert "/sleep" not in api.paths()
        eng.in_flight = 0
        api.routes["/sleep"] = lambda r: httpx.Response(201)
        assert await host._sleep(eng) is False and host._asleep == {}
        assert eng.state == "loaded" and eng.watch is not None
    finally:
        await host.aclose()
    none = _host(tmp_path, device="cuda", max_asleep=0)
    try:
        await none.load("gj#1", "gj", (0,))
        assert await none.unload("gj#1") is False and "/sleep" not in api.paths()[-1:]
    finally:
        await none.aclose()


async def test_a_failed_sleep_is_logged(
    tmp_path: Path, api: _Api, launch: _Launch, caplog: pytest.LogCaptureFixture
) -> None:
    def drop(r: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("dropped")

    host = _host(tmp_path, device="cuda")
    try:
        await host.load("gj#1", "gj", (0,))
        api.routes["/sleep"] = drop
        with caplog.at_level(logging.WARNING, logger=ej.__name__):
            assert await host.unload("gj#1") is False
            await host.load("gj#2", "gj", (0,))
            api.routes["/sleep"] = lambda r: httpx.Response(500)
            assert await host.unload("gj#2") is False
        assert "judge engine gj#1: sleep failed (dropped): ended instead" in caplog.messages
        assert "judge engine gj#2: sleep answered 500: ended instead" in caplog.messages
    finally:
        await host.aclose()


async def test_at_most_max_asleep_sleep_oldest_first(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, device="cuda", max_asleep=2)
    try:
        engs = []
        for i in range(4):
            await host.load(f"gj#{i}", "gj", (i,))
            engs.append(host._engines[f"gj#{i}"])
        for i in range(3):
            assert await host.unload(f"gj#{i}") is True
        assert list(host._asleep) == ["gj#1", "gj#2"]
        assert engs[0].proc.returncode == -signal.SIGTERM  # type: ignore[union-attr]
        assert engs[1].proc.returncode is None  # type: ignore[union-attr]
    finally:
        await host.aclose()
    assert host._asleep == {} and all(e.proc.returncode is not None for e in engs)  # type: ignore[union-attr]


async def test_wake_picks_its_own_id_then_the_model_on_those_devices(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, _spec(), _spec("b"), device="cuda", max_asleep=9)
    try:
        for iid, model, devs in (
            ("a", "gj", (0,)),
            ("b1", "b", (0,)),
            ("c", "gj", (0,)),
            ("d", "gj", (1,)),
            ("e", "gj", (0, 1)),
        ):
            await host.load(iid, model, devs)
        engs = dict(host._engines)
        for iid in engs:
            assert await host.unload(iid) is True
        await host.load("c", "gj", (0,), from_host=True)
        assert host._engines["c"] is engs["c"]
        await host.load("x", "gj", (0,), from_host=True)
        assert host._engines["x"] is engs["a"]
        await host.load("y", "gj", (0, 1), from_host=True)
        assert host._engines["y"] is engs["e"]
        assert list(host._asleep) == ["b1", "d"]
        await host.load("z", "gj", (0,), from_host=True)  # none left there: a new engine
        assert host._engines["z"] not in engs.values() and len(launch.runs) == 6
        assert host.resident()["z"]["from_host"] is False
    finally:
        await host.aclose()


@pytest.mark.parametrize("answer", ["500", "status", "drop", "notjson", "exited"])
async def test_an_engine_that_will_not_wake_is_ended(
    tmp_path: Path, api: _Api, launch: _Launch, answer: str, caplog: pytest.LogCaptureFixture
) -> None:
    def wake(r: httpx.Request) -> httpx.Response:
        if answer == "drop":
            raise httpx.ReadError("gone")
        if answer == "500":
            return httpx.Response(500, json={"status": "awake"})
        if answer == "notjson":
            return httpx.Response(200, content=b"<html>")
        return httpx.Response(200, json={"status": "sleeping" if answer == "status" else "awake"})

    host = _host(tmp_path, device="cuda")
    try:
        await host.load("gj#1", "gj", (0,))
        old = host._engines["gj#1"]
        assert await host.unload("gj#1") is True
        api.routes["/wake_up"] = wake
        if answer == "exited":
            os.kill(old.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            await old.proc.wait()  # type: ignore[union-attr]
        with caplog.at_level(logging.WARNING, logger=ej.__name__):
            await host.load("gj#2", "gj", (0,), from_host=True)
        new = host._engines["gj#2"]
        if answer != "exited":  # (ended at once: SIGKILL)
            assert old.proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]
        assert new is not old and old.proc.returncode is not None  # type: ignore[union-attr]
        assert host._asleep == {} and len(launch.runs) == 2
        assert [e["event"] for e in host.events] == ["load", "sleep", "load"]
        if answer == "drop":
            assert "judge engine gj#1: wake failed (gone): a new one starts" in caplog.messages
        if answer == "notjson":
            assert any(
                m.startswith("judge engine gj#1: wake failed (")
                and m.endswith("): a new one starts")
                for m in caplog.messages
            )
    finally:
        await host.aclose()


# ---- batches ------------------------------------------------------------------------------


async def test_a_batch_of_judgements_and_completions(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    spec = _spec(options={"template": "{response}", "max_tokens": 5, "seed": None})
    host = _host(tmp_path, spec)
    try:
        await host.load("gj#1", "gj", (0,))
        comp = {
            "openai": {
                "route": "completions",
                "body": {"prompt": "x", "max_tokens": 2, "model": "other"},
            }
        }
        acts = [
            _act("a"),
            _act("w", model="other"),
            _act("bad", prompt=3),
            _act("c", **comp),
            ActionSpec("n", kind=ActionKind.CODE, payload={"query": "q"}),
        ]
        out = await host.run_batch("gj#1", acts)
        va = JudgeVerdict(
            model="gj",
            reasoning="fine \\boxed{yes}",
            prompt_tokens=11,
            completion_tokens=3,
            finish_reason="stop",
            score=1.0,
            verdict="yes",
        )
        assert out.outputs == {
            "a": va,
            "n": va,
            "c": Completion.of("gj", "completions", {**TEXT, "model": "gj"}),
        }
        assert out.failed == {
            "w": "action names model 'other'; instance serves 'gj'",
            "bad": "bad payload: payload: needs query, prompt and response, or messages",
        }
        assert out.batch_size == 3 and 0 <= out.latency_s < 5
        posts = [s for s in api.seen if s[0] == "POST"]
        assert sorted((p[1], str(p[3])) for p in posts) == sorted(
            [
                (
                    "/v1/chat/completions",
                    str(
                        {
                            "model": "gj",
                            "max_tokens": 5,
                            "temperature": 0.0,
                            "messages": [{"role": "user", "content": "2"}],
                        }
                    ),
                ),
                (
                    "/v1/chat/completions",
                    str(
                        {
                            "model": "gj",
                            "max_tokens": 5,
                            "temperature": 0.0,
                            "messages": [{"role": "user", "content": "q"}],
                        }
                    ),
                ),
                ("/v1/completions", str({"max_tokens": 2, "n": 1, "prompt": "x", "model": "gj"})),
            ]
        )
        eng = host._engines["gj#1"]
        assert eng.served == 3 and eng.in_flight == 0
        assert out.outputs["c"].response["model"] == "gj"  # type: ignore[union-attr]
    finally:
        await host.aclose()


async def test_a_batch_for_an_instance_not_loaded(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path)
    try:
        with pytest.raises(BrokenError) as e:
            await host.run_batch("gj#1", [_act("a")])
        assert str(e.value) == "instance gj#1 is not loaded on this node"
        await host.load("gj#1", "gj", (0,))
        host._engines["gj#1"].state = "stopping"
        with pytest.raises(BrokenError) as e:
            await host.run_batch("gj#1", [_act("a")])
        assert str(e.value) == "instance gj#1 is not loaded on this node"
        host._engines["gj#1"].state = "loaded"
        assert await host.run_batch("gj#1", []) == BatchOutcome({}, {}, pytest.approx(0, abs=1), 0)
    finally:
        await host.aclose()


async def test_requests_in_flight_are_counted(tmp_path: Path, api: _Api, launch: _Launch) -> None:
    gate = asyncio.Event()
    seen: list[int] = []
    host = _host(tmp_path)

    async def chat(r: httpx.Request) -> httpx.Response:
        seen.append(host._engines["gj#1"].in_flight)
        await gate.wait()
        return httpx.Response(200, json=CHAT)

    api.routes["/v1/chat/completions"] = chat
    try:
        await host.load("gj#1", "gj", (0,))
        task = asyncio.create_task(host.run_batch("gj#1", [_act("a"), _act("b"), _act("c")]))
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        assert seen == [3, 3, 3] and host.resident()["gj#1"]["in_flight"] == 3
        other = asyncio.create_task(host.run_batch("gj#1", [_act("d"), _act("e")]))
        while len(seen) < 5:
            await asyncio.sleep(0.01)
        assert seen[3:] == [5, 5]  # (a second batch joins the first)
        gate.set()
        out = await task
        assert out.batch_size == 3 and (await other).batch_size == 2
        assert host._engines["gj#1"].in_flight == 0
    finally:
        gate.set()
        await host.aclose()


async def test_an_engine_answer_that_is_not_200_fails_the_action(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    api.routes["/v1/chat/completions"] = lambda r: httpx.Response(400, text="x" * 301 + "END")
    async with _loaded(tmp_path) as host:
        out = await host.run_batch("gj#1", [_act("a")])
        assert out == BatchOutcome(
            {}, {"a": "model gj answered 400: " + "x" * 300}, out.latency_s, 0
        )
        assert host._engines["gj#1"].served == 0


async def test_a_request_error_with_the_engine_alive_fails_the_action_only(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    def boom(r: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("too slow")

    api.routes["/v1/chat/completions"] = boom
    async with _loaded(tmp_path) as host:
        out = await host.run_batch("gj#1", [_act("a")])
        assert out.failed == {"a": "model gj failed: ReadTimeout: too slow"}
        assert host.engine_deaths == 0 and "gj#1" in host._engines


async def test_a_request_error_from_an_engine_that_exited_ends_it(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path)
    deaths: list[tuple[str, str]] = []
    host.on_worker_death = lambda iid, reason: deaths.append((iid, reason))

    def boom(r: httpx.Request) -> httpx.Response:
        os.kill(host._engines["gj#1"].proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        raise httpx.ConnectError("refused")

    api.routes["/v1/chat/completions"] = boom
    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        eng.watch.cancel()  # type: ignore[union-attr]  (this path, not the watcher's)
        with pytest.raises(EngineDied) as e:
            await host.run_batch("gj#1", [_act("a")])
        reason = (
            "the engine of judge instance gj#1 (gj) died: engine process exited with -9 "
            "(ConnectError: refused)"
        )
        assert (e.value.instance_id, e.value.reason, str(e.value)) == ("gj#1", reason, reason)
        assert deaths == [("gj#1", reason)] and eng.dead == reason and eng.state == "dead"
        assert host.health() == {"judge_engine_deaths": 1, "last_judge_engine_death": reason}
        assert host.events[-1] == {
            "event": "death",
            "instance": "gj#1",
            "model": "gj",
            "reason": reason,
        }
        assert host._engines == {}
    finally:
        await host.aclose()


async def test_check_alive_ignores_engines_not_loaded_or_without_a_process(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    async with _loaded(tmp_path) as host:
        eng = host._engines["gj#1"]
        eng.watch.cancel()  # type: ignore[union-attr]
        os.kill(eng.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        await eng.proc.wait()  # type: ignore[union-attr]
        eng.state = "stopping"
        await host._check_alive(eng, "x")
        assert eng.dead == "" and host.engine_deaths == 0
        eng.state = "loaded"
        proc, eng.proc = eng.proc, None
        await host._check_alive(eng, "x")
        assert eng.dead == ""
        eng.proc = proc
        await host._check_alive(eng, "seen")
        assert eng.dead.endswith("engine process exited with -9 (seen)")


async def test_check_alive_waits_a_second_at_most(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host(tmp_path)
    waits: list[float] = []

    async def wait_for(aw: Any, timeout: float) -> Any:  # (the second, shortened)
        waits.append(timeout)
        return await asyncio.wait_for(aw, 0.05)

    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait_for=wait_for))
        await host._check_alive(eng, "x")
        monkeypatch.setattr(ej, "asyncio", asyncio)
        assert waits == [1.0] and eng.dead == "" and eng.proc.returncode is None  # type: ignore[union-attr]
    finally:
        monkeypatch.setattr(ej, "asyncio", asyncio)
        await host.aclose()


async def test_an_engine_unloaded_before_its_process_started(tmp_path: Path) -> None:
    host = _host(tmp_path)
    host._engines["gj#1"] = ej._Engine("gj#1", _spec(), JudgeOptions(), (0,))
    assert await host.unload("gj#1", park=False) is False
    ev = host.events[-1]
    assert ev == {
        "event": "unload",
        "instance": "gj#1",
        "model": "gj",
        "seconds": ev["seconds"],
        "parked": False,
        "pid": None,
    }


# ---- supervision ---------------------------------------------------------------------------


async def test_an_engine_that_exits_while_idle_is_reported(
    tmp_path: Path, api: _Api, launch: _Launch, caplog: pytest.LogCaptureFixture
) -> None:
    host = _host(tmp_path)
    deaths: list[tuple[str, str]] = []

    def hook(iid: str, reason: str) -> None:
        deaths.append((iid, reason))
        raise RuntimeError("hook")

    host.on_worker_death = hook
    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        with caplog.at_level(logging.WARNING, logger=ej.__name__):
            os.kill(eng.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            for _ in range(300):
                if deaths:
                    break
                await asyncio.sleep(0.01)
        reason = "the engine of judge instance gj#1 (gj) died: engine process exited with -9"
        assert deaths == [("gj#1", reason)] and host.last_engine_death == reason
        assert "on_worker_death hook failed for gj#1" in caplog.messages
        assert f"{reason}; instance dropped" in caplog.messages
        assert host.engine_deaths == 1 and host.resident() == {}
        await host._died(eng, "again")  # (once only)
        stranger = ej._Engine("zz", _spec(), JudgeOptions(), (0,))
        await host._died(stranger, "not ours")
        assert host.engine_deaths == 1 and stranger.dead == "" and len(deaths) == 1
    finally:
        await host.aclose()


async def test_a_hung_engine_is_killed_and_its_batch_raises(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, _spec(options={"hang_s": 0}))
    deaths: list[str] = []
    host.on_worker_death = lambda iid, reason: deaths.append(reason)
    release = asyncio.Event()

    async def chat(r: httpx.Request) -> httpx.Response:
        await release.wait()
        raise httpx.ReadError("closed")

    def health(r: httpx.Request) -> httpx.Response:
        if host._engines.get("gj#1") is not None and host._engines["gj#1"].in_flight:
            raise httpx.ConnectTimeout("no answer")
        return httpx.Response(200)

    api.routes["/v1/chat/completions"] = chat
    api.routes["/health"] = health
    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        task = asyncio.create_task(host.run_batch("gj#1", [_act("a")]))
        for _ in range(300):
            if deaths:
                break
            await asyncio.sleep(0.01)
        assert deaths == [
            "the engine of judge instance gj#1 (gj) died: engine hung: no /health "
            "answer for 0.0s with 1 requests in flight"
        ]
        hc = [s for s in api.seen if s[1] == "/health"][-1]
        assert hc[4]["read"] == 1.0  # (max(1, min(5, hang_s)))
        for _ in range(300):
            if eng.proc.returncode is not None:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.01)
        assert eng.proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]
        release.set()
        with pytest.raises(EngineDied) as e:
            await task
        assert e.value.reason == deaths[0] and eng.in_flight == 0
    finally:
        release.set()
        await host.aclose()


async def test_health_is_asked_only_while_requests_are_in_flight(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host(tmp_path, _spec(options={"hang_s": 9}))
    plan = [0, 1, 0, 1, 1]  # requests in flight per pass; the loop ends after the last
    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        eng.watch.cancel()  # type: ignore[union-attr]
        api.routes["/health"] = lambda r: httpx.Response(503)
        passes: list[int] = []

        async def wait(fs: set[Any], timeout: float) -> tuple[set[Any], set[Any]]:
            passes.append(eng.in_flight)
            if len(passes) == len(plan):
                eng.state = "stopping"
            else:
                eng.in_flight = plan[len(passes)]
            return set(), fs

        eng.in_flight = plan[0]
        n = api.paths().count("/health")
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait=wait))
        await asyncio.wait_for(host._watch_loop(eng, eng.proc, eng.client, waiter), 5)  # type: ignore[arg-type]
        monkeypatch.setattr(ej, "asyncio", asyncio)
        assert passes == plan
        hc = [s for s in api.seen if s[1] == "/health"][n:]
        assert len(hc) == 3 and all(h[4]["read"] == 5.0 for h in hc)  # (min(5, hang_s))
        assert eng.dead == "" and host.engine_deaths == 0
        eng.state, eng.in_flight = "loaded", 0
    finally:
        await host.aclose()


async def test_hang_s_counts_from_the_first_silent_check_and_an_answer_resets_it(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host(tmp_path, _spec(options={"hang_s": 2}))
    deaths: list[str] = []
    host.on_worker_death = lambda iid, reason: deaths.append(reason)
    # per pass of the loop: requests in flight, and /health's answer when asked
    plan = [(1, 503), (0, 0), (1, 503), (1, 200), (1, 503), (1, 503), (1, 503), (1, 200)]
    codes = [c for n, c in plan if n]
    clock = [1000.0]
    waits: list[tuple[set[Any], float]] = []
    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines["gj#1"]
        eng.watch.cancel()  # type: ignore[union-attr]
        api.routes["/health"] = lambda r: httpx.Response(codes.pop(0))
        proc, client = eng.proc, eng.client
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def wait(fs: set[Any], timeout: float) -> tuple[set[Any], set[Any]]:
            waits.append((fs, timeout))
            clock[0] += 1.0
            eng.in_flight = plan[len(waits)][0]
            return set(), fs

        eng.in_flight = plan[0][0]
        monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait=wait))
        monkeypatch.setattr(ej, "time", _Proxy(ej.time, monotonic=lambda: clock[0]))
        await asyncio.wait_for(host._watch_loop(eng, proc, client, waiter), 5)  # type: ignore[arg-type]
        monkeypatch.undo()
        assert deaths == [
            "the engine of judge instance gj#1 (gj) died: engine hung: no /health "
            "answer for 2.0s with 1 requests in flight"
        ]
        assert len(waits) == 6 and all(w == ({waiter}, 1.0) for w in waits)
        assert codes == [200]  # (six asked; the seventh pass died)
        hc = [s for s in api.seen if s[1] == "/health"][-1]
        assert hc[4]["read"] == 2.0  # (max(1, min(5, hang_s)))
    finally:
        eng.in_flight = 0
        await host.aclose()


async def test_the_watch_loop_ends_when_the_engine_is_no_longer_loaded(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    async with _loaded(tmp_path) as host:
        eng = host._engines["gj#1"]
        eng.watch.cancel()  # type: ignore[union-attr]
        eng.state = "stopping"
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(host._watch_loop(eng, eng.proc, eng.client, waiter), 1)  # type: ignore[arg-type]
        eng.state = "loaded"


# ---- step costs ------------------------------------------------------------------------------


async def test_step_costs_widths_bodies_and_refusals(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host(tmp_path)
    seen: list[tuple[list[tuple[int, float]], int]] = []
    monkeypatch.setattr(
        ej, "fit_alpha_beta", lambda samples, n: seen.append((list(samples), n)) or (0.5, 0.25)
    )
    try:
        for k, tokens, repeats in ((8, 16, 1), (1, 16, 1), (8, 0, 1), (8, 16, 0)):
            with pytest.raises(BrokenError) as e:
                await host.step_costs("gj#1", k=k, tokens=tokens, repeats=repeats)
            assert str(e.value) == (
                "instance gj#1 is not loaded (or k < 2, tokens < 1, repeats < 1)"
            )
        await host.load("gj#1", "gj", (0,))
        for k, tokens, repeats in ((1, 16, 1), (8, 0, 1), (8, 16, 0)):
            with pytest.raises(BrokenError):
                await host.step_costs("gj#1", k=k, tokens=tokens, repeats=repeats)
        assert "/v1/completions" not in api.paths()
        clock = iter(float(i) for i in range(100))
        monkeypatch.setattr(ej, "time", _Proxy(ej.time, perf_counter=lambda: next(clock)))
        alpha, beta, s1, sk = await host.step_costs("gj#1", k=6, tokens=4, repeats=2)
        ((samples, min_sizes),) = seen
        assert min_sizes == 2 and (alpha, beta) == (0.5, 0.25)
        assert [n for n, _ in samples] == [1, 2, 4, 6, 1, 2, 4, 6]
        assert [y for _, y in samples] == [0.25] * 8  # (one clock step over 4 tokens)
        assert (s1, sk) == (0.25, 0.25)
        posts = [s for s in api.seen if s[1] == "/v1/completions"]
        assert len(posts) == 1 + 2 * (1 + 2 + 4 + 6)
        assert posts[0][3] == {
            "model": "gj",
            "prompt": "calibrate",
            "max_tokens": 4,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        seen.clear()
        await host.step_costs("gj#1")
        assert [n for n, _ in seen[0][0]] == [1, 2, 4, 8, 16, 32]
        assert api.seen[-1][3]["max_tokens"] == 64
        assert [y for _, y in seen[0][0]] == [1 / 64] * 6
        seen.clear()
        await host.step_costs("gj#1", k=2, tokens=1)
        assert [n for n, _ in seen[0][0]] == [1, 2]
        eng = host._engines["gj#1"]
        eng.state = "stopping"
        with pytest.raises(BrokenError):
            await host.step_costs("gj#1")
        eng.state = "loaded"
        client, eng.client = eng.client, None
        with pytest.raises(BrokenError):
            await host.step_costs("gj#1")
        eng.client = client
    finally:
        await host.aclose()


async def test_step_costs_medians_and_a_failed_request(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _loaded(tmp_path) as host:
        ticks = iter([0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 10.0, 13.0, 20.0, 24.0, 30.0, 38.0])
        monkeypatch.setattr(ej, "time", _Proxy(ej.time, perf_counter=lambda: next(ticks)))
        alpha, beta, s1, sk = await host.step_costs("gj#1", k=2, tokens=2, repeats=3)
        # width 1: 1, 2, 4 s over 2 tokens; width 2: 1, 3, 8 s over 2 tokens
        assert (s1, sk) == (1.0, 1.5)
        fit = ej.fit_alpha_beta([(1, 0.5), (2, 0.5), (1, 1.0), (2, 1.5), (1, 2.0), (2, 4.0)], 2)
        assert fit is not None and (alpha, beta) == fit
        monkeypatch.setattr(ej, "time", time)
        api.routes["/v1/completions"] = lambda r: httpx.Response(500)
        with pytest.raises(httpx.HTTPStatusError):
            await host.step_costs("gj#1", k=2, tokens=1)


# ---- construction, reports, logs, close ------------------------------------------------------


def test_construction_defaults_and_bad_settings(tmp_path: Path) -> None:
    h = EngineJudgeHost([_spec()])
    assert (h.device, h.sleep_level, h.max_asleep, h._log_dir, h._own_log_dir) == (
        "cpu",
        0,
        4,
        None,
        None,
    )
    assert h._engines == {} and h._asleep == {} and h.events == [] and not h._closed
    assert h.on_worker_death is None and h.engine_deaths == 0 and h.last_engine_death == ""
    assert h.health() == {"judge_engine_deaths": 0, "last_judge_engine_death": ""}
    assert h.resident() == {} and h._opts == {"gj": JudgeOptions()}
    assert EngineJudgeHost([], device="cuda").sleep_level == 1
    assert EngineJudgeHost([], device="cuda", sleep_level=0).sleep_level == 0
    assert EngineJudgeHost([], device="cpu", sleep_level=2).sleep_level == 2
    assert EngineJudgeHost([], max_asleep=0).max_asleep == 0
    for bad in (-1, 3):
        with pytest.raises(ValueError) as e:
            EngineJudgeHost([], sleep_level=bad)
        assert str(e.value) == f"sleep_level: 0 (none), 1 or 2, got {bad!r}"
    with pytest.raises(ValueError) as e:
        EngineJudgeHost([], max_asleep=-1)
    assert str(e.value) == "max_asleep: must be >= 0, got -1"
    with pytest.raises(ValueError) as e:
        EngineJudgeHost([_spec(options={"hang_s": -1})])
    assert str(e.value) == "model gj: options.hang_s: must be finite and >= 0"


async def test_the_own_log_directory_is_made_once_and_removed_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    h = EngineJudgeHost([_spec()])
    d = h._logs()
    assert Path(d).parent == tmp_path and Path(d).name.startswith("tangram-judge-")
    assert h._logs() == d and h._own_log_dir == d
    (Path(d) / "x.log").write_text("x")
    await h.aclose()
    assert not Path(d).exists()
    await h.aclose()
    gone = EngineJudgeHost([_spec()])
    Path(gone._logs()).rmdir()  # (removed by someone else first: the close still succeeds)
    await gone.aclose()
    named = EngineJudgeHost([_spec()], log_dir=str(tmp_path / "mine"))
    assert named._logs() == str(tmp_path / "mine") and named._own_log_dir is None


async def test_close_ends_loaded_and_sleeping_engines(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, device="cuda")
    await host.load("gj#1", "gj", (0,))
    await host.load("gj#2", "gj", (1,))
    a, b = host._engines["gj#1"], host._engines["gj#2"]
    assert await host.unload("gj#2") is True
    await host.aclose()
    assert host._engines == {} and host._asleep == {} and host._closed
    assert a.proc.returncode is not None and b.proc.returncode is not None  # type: ignore[union-attr]
    assert [e["event"] for e in host.events] == ["load", "load", "sleep", "unload"]
    await host.aclose()
    assert len(host.events) == 4


def test_resident_shows_an_engine_without_a_process_yet(tmp_path: Path) -> None:
    host = _host(tmp_path)
    host._engines["gj#1"] = ej._Engine("gj#1", _spec(), JudgeOptions(), (1, 2))
    assert host.resident() == {
        "gj#1": {
            "model": "gj",
            "devices": (1, 2),
            "state": "loading",
            "from_host": False,
            "load_s": None,
            "engine": "vllm",
            "pid": None,
            "in_flight": 0,
        }
    }
    assert host.engine_pid("gj#1") is None
    assert host.base_url("gj#1") == "http://127.0.0.1:0"


async def test_a_bad_template_fails_each_judgement_naming_the_model(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, _spec(options={"template": "{nope}"}))
    try:
        await host.load("gj#1", "gj", (0,))
        out = await host.run_batch("gj#1", [_act("a")])
        assert out.failed == {"a": "bad payload: options.template of model gj: KeyError('nope')"}
        assert "/v1/chat/completions" not in api.paths()
    finally:
        await host.aclose()


async def test_each_engine_death_counts(tmp_path: Path, api: _Api, launch: _Launch) -> None:
    host = _host(tmp_path)
    try:
        await host.load("a", "gj", (0,))
        await host.load("b", "gj", (1,))
        await host._died(host._engines["a"], "x")
        await host._died(host._engines["b"], "y")
        assert host.engine_deaths == 2 and host.health() == {
            "judge_engine_deaths": 2,
            "last_judge_engine_death": "the engine of judge instance b (gj) died: y",
        }
    finally:
        await host.aclose()


class _Kills:
    """engine_judge's `os.killpg`, recorded (and, where told, failing after it acted)."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.fail: dict[int, type[OSError]] = {}  # the n-th call -> the error it raises

    def __call__(self, pgid: int, sig: int) -> None:
        n = len(self.sent)
        self.sent.append(sig)
        if n in self.fail:  # (the group went away meanwhile: it is gone now)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            raise self.fail[n]("gone")
        os.killpg(pgid, sig)


def _term_proof(launch: _Launch, tmp_path: Path) -> Path:
    ready = tmp_path / "ready"
    launch.cmd = [
        "sh",
        "-c",
        f"trap '' TERM; touch {ready}; for i in $(seq 400); do sleep 0.05; done",
    ]
    return ready


async def test_unloaded_mid_start_the_start_loop_gives_up(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that ignores SIGTERM, unloaded while it starts: the start loop sees it is no
    longer this host's (the unload still waiting out its grace) and the load fails so."""
    _term_proof(launch, tmp_path)
    api.routes["/health"] = lambda r: httpx.Response(503)
    kills = _Kills()
    monkeypatch.setattr(ej, "os", _Proxy(os, killpg=kills))

    async def wait_for(aw: Any, timeout: float) -> Any:  # (the grace, shortened)
        return await asyncio.wait_for(aw, min(timeout, 1.5))

    monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait_for=wait_for))
    host = _host(tmp_path)
    try:
        task = asyncio.create_task(host.load("gj#1", "gj", (0,)))
        while len(api.seen) < 2:
            await asyncio.sleep(0.01)
        unload = asyncio.create_task(host.unload("gj#1", park=False))
        with pytest.raises(BrokenError) as e:
            await task
        assert str(e.value) == "instance gj#1 was unloaded while it was loading"
        assert await unload is False
        assert kills.sent[:2] == [signal.SIGTERM, signal.SIGKILL]  # (the load's: at once)
    finally:
        await host.aclose()


async def test_unloaded_mid_start_after_its_health_answered(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    _term_proof(launch, tmp_path)
    gate = asyncio.Event()

    async def health(r: httpx.Request) -> httpx.Response:
        await gate.wait()
        return httpx.Response(200)

    api.routes["/health"] = health
    kills = _Kills()
    monkeypatch.setattr(ej, "os", _Proxy(os, killpg=kills))

    async def wait_for(aw: Any, timeout: float) -> Any:
        return await asyncio.wait_for(aw, min(timeout, 1.5))

    monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait_for=wait_for))
    host = _host(tmp_path)
    try:
        task = asyncio.create_task(host.load("gj#1", "gj", (0,)))
        while not api.seen:
            await asyncio.sleep(0.01)
        unload = asyncio.create_task(host.unload("gj#1", park=False))
        while not kills.sent:
            await asyncio.sleep(0.01)
        gate.set()  # (health answers now: the start is done, but the engine is gone)
        with pytest.raises(BrokenError) as e:
            await task
        assert str(e.value) == "instance gj#1 was unloaded while it was loading"
        await unload
        assert kills.sent[:2] == [signal.SIGTERM, signal.SIGKILL]
    finally:
        gate.set()
        await host.aclose()


async def test_the_start_deadline_is_passed_only_after_it(
    tmp_path: Path, api: _Api, launch: _Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.routes["/health"] = lambda r: httpx.Response(503)
    ticks = iter([100.0, 100.0, 101.0])
    monkeypatch.setattr(ej, "time", _Proxy(time, monotonic=lambda: next(ticks)))
    host = _host(tmp_path, _spec(options={"start_timeout_s": 0}))
    try:
        with pytest.raises(BrokenError) as e:
            await host.load("gj#1", "gj", (0,))
        assert str(e.value).startswith("judge engine gj#1 did not answer within 0s: ")
        assert api.paths() == ["/health", "/health"]  # (at the deadline itself: not yet)
    finally:
        monkeypatch.setattr(ej, "time", time)
        await host.aclose()


async def test_stop_goes_on_when_the_client_will_not_close(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    async with _loaded(tmp_path) as host:
        eng = host._engines.pop("gj#1")
        eng.watch.cancel()  # type: ignore[union-attr]

        class Broken:
            async def aclose(self) -> None:
                raise RuntimeError("cannot close")

        eng.client = Broken()  # type: ignore[assignment]
        await host._stop(eng)
        assert eng.proc.returncode == -signal.SIGTERM  # type: ignore[union-attr]


@pytest.mark.parametrize("error", [ProcessLookupError, PermissionError])
@pytest.mark.parametrize("at", ["first", "grace", "last"])
async def test_stop_goes_on_when_the_group_is_gone(
    tmp_path: Path,
    api: _Api,
    launch: _Launch,
    monkeypatch: pytest.MonkeyPatch,
    error: type[OSError],
    at: str,
) -> None:
    """The group is found gone by the first signal, by the SIGKILL after the grace (an
    engine that ignores SIGTERM), or by the last SIGKILL to the group."""
    ready = _term_proof(launch, tmp_path) if at == "grace" else None
    host = _host(tmp_path)
    kills = _Kills()
    kills.fail[{"first": 0, "grace": 1, "last": 1}[at]] = error

    async def wait_for(aw: Any, timeout: float) -> Any:
        return await asyncio.wait_for(aw, min(timeout, 0.5))

    try:
        await host.load("gj#1", "gj", (0,))
        eng = host._engines.pop("gj#1")
        eng.watch.cancel()  # type: ignore[union-attr]
        while ready is not None and not ready.exists():
            await asyncio.sleep(0.01)
        monkeypatch.setattr(ej, "os", _Proxy(os, killpg=kills))
        monkeypatch.setattr(ej, "asyncio", _Proxy(asyncio, wait_for=wait_for))
        await host._stop(eng)
        assert eng.proc.returncode is not None  # type: ignore[union-attr]
        assert (
            kills.sent
            == [signal.SIGTERM, signal.SIGKILL, signal.SIGKILL][: 3 if at == "grace" else 2]
        )
    finally:
        monkeypatch.setattr(ej, "os", os)
        monkeypatch.setattr(ej, "asyncio", asyncio)
        await host.aclose()


async def test_a_plain_load_never_wakes_a_sleeping_engine(
    tmp_path: Path, api: _Api, launch: _Launch
) -> None:
    host = _host(tmp_path, device="cuda")
    try:
        await host.load("gj#1", "gj", (0,))
        assert await host.unload("gj#1") is True
        await host.load("gj#2", "gj", (0,))
        assert len(launch.runs) == 2 and list(host._asleep) == ["gj#1"]
        assert "/wake_up" not in api.paths()
    finally:
        await host.aclose()
