"""vLLM's sleep mode as the judge engines' park (issue 38, item 2), against a stand-in server.

NOT vLLM: no GPU here, and vLLM's sleep mode runs on CUDA only. The stand-in is a small HTTP
server speaking the routes vLLM's dev mode serves (`vllm/entrypoints/serve/dev/sleep/
api_router.py`: ``POST /sleep?level=``, ``POST /wake_up`` answering ``{"status": "awake"}``,
``GET /health``); it records its argv, the env var that turns those routes on, and every call.
What is pinned: the flags and env an engine starts with, sleep on a park, wake on a load from
host on the same devices (its own id first), a cold start elsewhere, `max_asleep`, the events and
`resident`'s ``from_host``, and that CPU never sleeps. On a GPU task the same host must be run
against vLLM itself (docs/reward-models.md)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu.engine_judge import EngineJudgeHost

STAND_IN = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
log = os.environ["STAND_IN_LOG"]
def note(**kw):
    with open(log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **kw}) + "\n")
note(call="start", argv=sys.argv[1:], dev=os.environ.get("VLLM_SERVER_DEV_MODE"),
     cuda=os.environ.get("CUDA_VISIBLE_DEVICES"))
class H(BaseHTTPRequestHandler):
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._send({})
    def do_POST(self):
        path, _, query = self.path.partition("?")
        note(call=path, query=query)
        fail = os.environ.get("STAND_IN_FAIL", "")  # "<route>:<500|drop>"
        if fail.startswith(path + ":"):
            if fail.endswith(":drop"):  # (no answer at all: the connection closes)
                self.close_connection = True
                return
            self.send_response(500); self.send_header("content-length", "0"); self.end_headers()
            return
        if path == "/sleep":
            self._send({"status": "sleeping", "level": int(query.split("=")[1])})
        elif path == "/wake_up":
            self._send({"status": "awake", "tags": None})
        else:
            self.send_response(404); self.end_headers()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


class _Host(EngineJudgeHost):
    """The real host, its engine command pointed at the stand-in (the same flags after it)."""

    script = ""

    def _argv(self, eng: Any) -> list[str]:
        argv = super()._argv(eng)
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        return [sys.executable, self.script, *argv[3:]]


def _spec(name: str) -> ModelSpec:
    return ModelSpec(name, kind="genjudge", path="/nonexistent", memory_mb=64.0,
                     options={"max_tokens": 8, "max_model_len": 64})


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setattr(_Host, "script", str(script))
    return tmp_path / "calls.jsonl"


def test_a_parked_engine_sleeps_and_a_load_from_host_wakes_it(stand_in: Path) -> None:
    async def go() -> None:
        host = _Host([_spec("gj"), _spec("other")], device="cuda", python=sys.executable,
                     max_asleep=2)
        try:
            await host.load("gj#1", "gj", (0,))
            (start,) = [c for c in _log(stand_in) if c["call"] == "start"]
            assert "--enable-sleep-mode" in start["argv"] and start["dev"] == "1"
            assert start["cuda"] == "0" and "--enforce-eager" not in start["argv"]
            i = start["argv"].index("--kv-cache-memory-bytes")  # (kv_cache_gb 1.0: not 90% of it)
            assert start["argv"][i + 1] == str(1 << 30)
            pid = host.engine_pid("gj#1")
            assert pid is not None
            # a park: asleep (True), the process kept, out of `resident`
            assert await host.unload("gj#1", park=True) is True
            assert host.resident() == {} and _alive(pid)
            assert [(c["call"], c["query"]) for c in _log(stand_in) if c["call"] != "start"] == [
                ("/sleep", "level=1")]
            # a load from host on the same devices wakes it, under the new id
            secs = await host.load("gj#2", "gj", (0,), from_host=True)
            assert secs >= 0.0 and host.engine_pid("gj#2") == pid
            got = host.resident()["gj#2"]
            assert (got["from_host"], got["state"], got["devices"]) == (True, "loaded", (0,))
            assert [e["event"] for e in host.events] == ["load", "sleep", "wake"]
            assert host.events[1]["level"] == 1 and host.events[2]["from_host"] is True
            # asleep again; a load from host on other devices starts a new engine (the sleeper
            # stays: bound to its device), and a plain unload ends the process
            assert await host.unload("gj#2", park=True) is True
            await host.load("gj#3", "gj", (1,), from_host=True)
            assert host.engine_pid("gj#3") != pid and host.resident()["gj#3"]["from_host"] is False
            assert _alive(pid)
            new = host.engine_pid("gj#3")
            assert new is not None
            assert await host.unload("gj#3", park=False) is False
            await asyncio.sleep(0.2)
            assert not _alive(new)
            # at most max_asleep (2) sleep: a third ends the oldest
            await host.load("o#1", "other", (1,))
            await host.load("o#2", "other", (2,))
            pids = [host.engine_pid("o#1"), host.engine_pid("o#2")]
            assert await host.unload("o#1", park=True) and await host.unload("o#2", park=True)
            await asyncio.sleep(0.2)
            assert not _alive(pid) and all(p is not None and _alive(p) for p in pids)
            assert list(host._asleep) == ["o#1", "o#2"]
        finally:
            await host.aclose()
        assert host._asleep == {}
        await asyncio.sleep(0.2)
        assert not any(_alive(c["pid"]) for c in _log(stand_in) if c["call"] == "start")

    asyncio.run(go())


def test_on_cpu_nothing_sleeps(stand_in: Path) -> None:
    async def go() -> None:
        host = _Host([_spec("gj")], device="cpu", python=sys.executable)
        try:
            assert host.sleep_level == 0
            await host.load("gj#1", "gj", (0,))
            (start,) = [c for c in _log(stand_in) if c["call"] == "start"]
            assert "--enable-sleep-mode" not in start["argv"] and start["dev"] is None
            assert "--kv-cache-memory-bytes" not in start["argv"]  # (CPU: VLLM_CPU_KVCACHE_SPACE)
            assert await host.unload("gj#1", park=True) is False
            assert [c["call"] for c in _log(stand_in)] == ["start"]  # (no /sleep)
            assert [e["event"] for e in host.events] == ["load", "unload"]
        finally:
            await host.aclose()

    asyncio.run(go())


def test_the_engines_logs_go_to_log_dir_or_to_an_own_directory_removed_at_close(
        stand_in: Path, tmp_path: Path) -> None:
    """No ``log_dir``: a ``tangram-judge-*`` directory of the host's own, made at the first start
    (none for a host that starts nothing) and removed at close; a named one is the caller's: kept."""
    async def go() -> None:
        idle = _Host([_spec("gj")], device="cpu", python=sys.executable)
        assert idle._log_dir is None
        await idle.aclose()
        gone = _Host([_spec("gj")], device="cpu", python=sys.executable)
        Path(gone._logs()).rmdir()  # (removed by someone else first: the close still succeeds)
        await gone.aclose()
        host = _Host([_spec("gj")], device="cpu", python=sys.executable)
        try:
            await host.load("gj#1", "gj", (0,))
            own = Path(host._logs())
            assert own.name.startswith("tangram-judge-") and own.parent == Path(tempfile.gettempdir())
            assert (own / "gj#1.log").is_file() and host._logs() == str(own)
        finally:
            await host.aclose()
        assert not own.exists()
        named = tmp_path / "logs"
        named.mkdir()
        kept = _Host([_spec("gj")], device="cpu", python=sys.executable, log_dir=str(named))
        try:
            await kept.load("gj#1", "gj", (0,))
        finally:
            await kept.aclose()
        assert (named / "gj#1.log").is_file()

    asyncio.run(go())


def test_bad_sleep_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"sleep_level: 0 \(none\), 1 or 2, got 3"):
        EngineJudgeHost([], device="cuda", sleep_level=3)
    with pytest.raises(ValueError, match="max_asleep: must be >= 0, got -1"):
        EngineJudgeHost([], device="cuda", max_asleep=-1)
    assert EngineJudgeHost([], device="cuda").sleep_level == 1


@pytest.mark.parametrize("fail", ["/sleep:500", "/sleep:drop", "/wake_up:500", "/wake_up:drop"])
def test_an_engine_that_will_not_sleep_or_wake_is_ended_and_a_new_one_starts(
        stand_in: Path, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    monkeypatch.setenv("STAND_IN_FAIL", fail)

    async def go() -> None:
        host = _Host([_spec("gj")], device="cuda", python=sys.executable)
        try:
            await host.load("gj#1", "gj", (0,))
            pid = host.engine_pid("gj#1")
            assert pid is not None
            slept = await host.unload("gj#1", park=True)
            assert slept is fail.startswith("/wake_up")  # (a failed sleep: ended, not parked)
            await host.load("gj#2", "gj", (0,), from_host=True)
            new = host.engine_pid("gj#2")
            assert new is not None and new != pid  # (never woken: a new engine)
            assert host.resident()["gj#2"]["from_host"] is False and host._asleep == {}
            await asyncio.sleep(0.2)
            assert not _alive(pid)
            assert [e["event"] for e in host.events] == (
                ["load", "sleep", "load"] if slept else ["load", "unload", "load"])
        finally:
            await host.aclose()

    asyncio.run(go())


def test_an_engine_with_requests_in_flight_is_not_put_to_sleep(stand_in: Path) -> None:
    async def go() -> None:
        host = _Host([_spec("gj")], device="cuda", python=sys.executable)
        try:
            await host.load("gj#1", "gj", (0,))
            host._engines["gj#1"].in_flight = 1
            assert await host.unload("gj#1", park=True) is False
            assert [c["call"] for c in _log(stand_in)] == ["start"]  # (no /sleep asked)
        finally:
            await host.aclose()

    asyncio.run(go())
