"""Generative judges on an inference engine (issue 38): one vLLM server process per instance.

Invariant: like the GPU manager, this host decides nothing. It carries out the scheduler's
LoadModel / UnloadModel / RunBatch for models of kind ``genjudge`` and reports what it measured.
Each instance is its own process group: ``python -m vllm.entrypoints.openai.api_server`` (vLLM's
OpenAI-compatible server) run from the judge engine's virtual environment
(``scripts/judge-engine.sh``: vLLM pins versions the service's own .venv cannot take), bound to
127.0.0.1 on a free port, on the instance's devices (CUDA_VISIBLE_DEVICES on CUDA). A batch is
its actions sent as concurrent requests: the engine's scheduler admits them into the batch it is
running (continuous batching), so several RunBatch of one instance run at once (the core sends
up to ``ModelSpec.max_seqs`` actions in flight, which is also the engine's ``--max-num-seqs``).

Generative judging: the payload (`kinds.JudgeRequest`, typed at the edge; a library caller's
mapping parsed here by `kinds.judge_request`: ``query`` or ``prompt`` + ``response``, or
``messages``) is formatted by ``options.template``, sent as a chat (``chat_template: true``, the model's own
template) or a plain completion, generated up to ``max_tokens``, and the verdict read by the
configured rule (verdict.py). The output (`kinds.JudgeVerdict`): ``score``, ``verdict`` (what
the rule found), ``reasoning`` (the generated text), ``prompt_tokens``, ``completion_tokens``,
``finish_reason``, ``model``. No verdict: the action fails, naming the rule and the tokens generated
(``on_no_verdict: fail``, the default), or gets the configured score with ``verdict: null``.
A completion (`JudgeRequest.route` set; ``{"openai": {"route", "body"}}`` as a mapping) is an
OpenAI-style request sent as its typed fields say (`JudgeRequest.openai_body`,
api/openai_compat.py); its output (`kinds.Completion`) is ``{"openai": <the engine's
response>, "model"}`` on the wire.

Supervision: a process per instance gives fault isolation -- a crash, ``kill -9`` or the OOM
killer ends one engine, never the service. An engine whose process exits, or that stops answering
its ``/health`` while requests are in flight (``hang_s``), is killed (its whole process group),
dropped, and reported through ``on_worker_death(instance, reason)`` before its batches' calls
raise `EngineDied` -- the same path as the GPU manager's dead workers: the core requeues the
batches once, loads a replacement, and the engine marks the model down meanwhile.

Sleep and wake: vLLM's sleep mode is the GPU manager's park (the paper's state restorable from
CPU memory), on CUDA only (vLLM: CUDA, ROCm, XPU). On ``device="cuda"`` (and ``sleep_level`` 1
or 2) each engine starts with ``--enable-sleep-mode`` and its dev routes; an ``unload`` asked to
park puts it to sleep (``POST /sleep?level=L``: level 1 offloads the weights to CPU memory,
level 2 drops them) and returns True; a ``load`` with ``from_host`` wakes a sleeping engine of
the model on the same devices (``POST /wake_up``) instead of starting one, and says so in
`resident` (``from_host``) and `events` (``sleep`` / ``wake``, measured seconds). A sleeping
engine is bound to its devices (its CUDA context); one that cannot be woken there is ended, and
at most ``max_asleep`` sleep (the oldest ended first). On CPU an unload ends the process and a
load starts a new one (``unload`` returns False: the core counts the instance as gone).
NOT YET RUN ON A GPU: the sleep path is tested here against a stand-in server speaking vLLM's
routes (tests/managers/gpu/test_gpu_judge_sleep.py), never against vLLM on CUDA (docs/reward-models.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ...core.actions import ActionSpec
from ...core.cluster import ModelSpec
from ...core.errors import BrokenError, ClosedError
from ...kinds import Completion, JudgeRequest, JudgeVerdict, Outcome, judge_request
from .config import BatchOutcome
from .costs import fit_alpha_beta
from .verdict import VerdictRule, parse

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Question:\n{prompt}\n\nResponse:\n{response}\n\n"
    "Is the response correct? Think briefly, then give your final answer as \\boxed{{yes}} "
    "or \\boxed{{no}}."
)


class EngineDied(BrokenError):
    """The instance's engine died or hung mid-batch: the instance is gone."""

    def __init__(self, instance_id: str, reason: str) -> None:
        super().__init__(reason)
        self.instance_id, self.reason = instance_id, reason


def engine_python() -> str:
    """The interpreter of the judge engine's venv: ``ARL_TANGRAM_JUDGE_PYTHON``, else
    ``<this venv>/engines/vllm/bin/python`` (where scripts/judge-engine.sh installs it)."""
    env = os.environ.get("ARL_TANGRAM_JUDGE_PYTHON")
    if env:
        return env
    return str(Path(sys.prefix) / "engines" / "vllm" / "bin" / "python")


def engine_available() -> str | None:
    """None when the judge engine's interpreter exists, else why not."""
    py = engine_python()
    if not os.access(py, os.X_OK):
        return f"judge engine not installed ({py} missing: run scripts/judge-engine.sh)"
    return None


@dataclass(frozen=True)
class JudgeOptions:
    """``ModelSpec.options`` of a genjudge model (docs/reward-models.md, "Judge engines")."""

    engine: str = "vllm"
    template: str = DEFAULT_TEMPLATE
    chat_template: bool = True
    system: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = 0
    verdict: VerdictRule = field(default_factory=VerdictRule)
    on_no_verdict: str | float = "fail"
    max_model_len: int = 4096
    kv_cache_gb: float = 1.0
    start_timeout_s: float = 600.0
    hang_s: float = 30.0  # no /health answer for this long while requests are in flight: hung
    request_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: ModelSpec) -> JudgeOptions:
        """Parse and check ``spec.options``; ValueError naming the option."""
        o = dict(spec.options)
        known = set(cls.__dataclass_fields__)
        unknown = set(o) - known
        if unknown:
            raise ValueError(f"model {spec.name}: options.{sorted(unknown)[0]}: unknown option")
        kw: dict[str, Any] = {}
        try:
            if "engine" in o:
                kw["engine"] = str(o["engine"])
                if kw["engine"] != "vllm":
                    raise ValueError("options.engine: only 'vllm' is supported")
            for k in ("template", "system"):
                if k in o:
                    kw[k] = None if o[k] is None else str(o[k])
            if "chat_template" in o:
                kw["chat_template"] = bool(o["chat_template"])
            for k in ("max_tokens", "max_model_len"):
                if k in o:
                    kw[k] = int(o[k])
                    if kw[k] < 1:
                        raise ValueError(f"options.{k}: must be >= 1")
            for k in ("temperature", "kv_cache_gb", "start_timeout_s", "hang_s", "request_timeout_s"):
                if k in o:
                    kw[k] = float(o[k])
                    if not math.isfinite(kw[k]) or kw[k] < 0:
                        raise ValueError(f"options.{k}: must be finite and >= 0")
            if "seed" in o:
                kw["seed"] = None if o["seed"] is None else int(o["seed"])
            kw["verdict"] = VerdictRule.from_options(o.get("verdict"))
            if "on_no_verdict" in o:
                nv = o["on_no_verdict"]
                if nv != "fail":
                    nv = float(nv)
                    if not math.isfinite(nv):
                        raise ValueError("options.on_no_verdict: 'fail' or a finite score")
                kw["on_no_verdict"] = nv
            if "extra_args" in o:
                kw["extra_args"] = tuple(str(a) for a in o["extra_args"])
        except ValueError as exc:
            msg = str(exc)
            if not msg.startswith(("options.", "verdict")):
                msg = f"options: {msg}"  # (a bad number: float()'s own message)
            raise ValueError(f"model {spec.name}: {msg}") from None
        out = cls(**kw)
        if out.max_tokens >= out.max_model_len:
            raise ValueError(f"model {spec.name}: options.max_tokens ({out.max_tokens}) must be "
                             f"below options.max_model_len ({out.max_model_len})")
        return out


@dataclass(eq=False)
class _Engine:
    """One running engine process (mutable, private)."""

    id: str
    spec: ModelSpec
    opts: JudgeOptions
    devices: tuple[int, ...]
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    log_path: str = ""
    client: httpx.AsyncClient | None = None
    state: str = "loading"  # loading | loaded | stopping | dead
    load_s: float | None = None
    in_flight: int = 0
    dead: str = ""
    watch: asyncio.Task[None] | None = None
    served: int = 0  # requests answered
    from_host: bool = False  # woken from sleep (vLLM's sleep mode), not started


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: str, n: int = 12) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [ln for ln in lines if "Error" in ln or "error" in ln] or lines
    return "\n".join(keep[-n:])


def judge_messages(spec: ModelSpec, opts: JudgeOptions,
                   payload: Mapping[str, Any]) -> list[dict[str, str]] | str:
    """The chat messages (``chat_template``) or the prompt text of a judgement (its typed
    request, `kinds.JudgeRequest`; a plain mapping is parsed as one: InvalidAction, a
    ValueError, naming the payload field when it is unusable)."""
    req = judge_request(payload)
    if req.messages is not None:
        out = [m.wire() for m in req.messages]
        return out if opts.chat_template else "\n".join(m["content"] for m in out)
    if req.response is not None:
        prompt, response = req.prompt if isinstance(req.prompt, str) else "", req.response
    else:
        prompt, response = "", req.query or ""
    try:
        text = opts.template.format(prompt=prompt, response=response, query=response)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"options.template of model {spec.name}: {exc!r}") from None
    if not opts.chat_template:
        return text
    out = [{"role": "system", "content": opts.system}] if opts.system else []
    return [*out, {"role": "user", "content": text}]


class EngineJudgeHost:
    """Judge engines (kind genjudge) on one node: one vLLM server process per instance."""

    def __init__(self, models: Sequence[ModelSpec], *, device: str = "cpu",
                 python: str | None = None, log_dir: str | None = None,
                 sleep_level: int | None = None, max_asleep: int = 4) -> None:
        self._specs = {m.name: m for m in models}
        self._opts = {m.name: JudgeOptions.of(m) for m in models}
        self.device = device  # "cpu" | "cuda"
        # vLLM's sleep mode as the park (module doc): its level, 0 for none (CUDA: 1 unless told)
        self.sleep_level = (1 if device == "cuda" else 0) if sleep_level is None else sleep_level
        if self.sleep_level not in (0, 1, 2):
            raise ValueError(f"sleep_level: 0 (none), 1 or 2, got {self.sleep_level!r}")
        if max_asleep < 0:
            raise ValueError(f"max_asleep: must be >= 0, got {max_asleep}")
        self.max_asleep = max_asleep
        self._asleep: dict[str, _Engine] = {}  # instance id -> a sleeping engine (oldest first)
        self.python = python or engine_python()
        # the engines' logs: ``log_dir``, or a temporary directory of our own, made at the first
        # start and removed at close (a failed start's tail is in its error already)
        self._log_dir = log_dir
        self._own_log_dir: str | None = None
        self._engines: dict[str, _Engine] = {}
        self._closed = False
        self.on_worker_death: Callable[[str, str], None] | None = None
        self.engine_deaths = 0
        self.last_engine_death = ""
        self.events: list[dict[str, Any]] = []  # load / unload / death, with measured seconds

    def serves(self, model: str) -> bool:
        return model in self._specs

    # ---- commands ------------------------------------------------------------------------
    async def load(self, instance_id: str, model: str, devices: tuple[int, ...],
                   from_host: bool = False) -> float:
        """Start an engine for ``instance_id`` and wait until it answers; measured seconds."""
        if self._closed:
            raise ClosedError("the judge engine host is closed")
        spec = self._specs.get(model)
        if spec is None:
            raise BrokenError(f"model {model!r} is not a judge engine here")
        if instance_id in self._engines:
            raise BrokenError(f"instance {instance_id} already exists")
        why = None if self.python != engine_python() else engine_available()
        if why is not None:
            raise BrokenError(why)
        if from_host:
            woken = await self._wake(instance_id, model, tuple(devices))
            if woken is not None:
                return woken
        eng = _Engine(instance_id, spec, self._opts[model], tuple(devices))
        self._engines[instance_id] = eng
        t0 = time.perf_counter()
        try:
            await self._start(eng)
        except BaseException:
            self._engines.pop(instance_id, None)
            await self._stop(eng, kill=True)
            raise
        if self._engines.get(instance_id) is not eng:
            await self._stop(eng, kill=True)
            raise BrokenError(f"instance {instance_id} was unloaded while it was loading")
        eng.load_s = time.perf_counter() - t0
        eng.state = "loaded"
        eng.watch = asyncio.create_task(self._watch(eng), name=f"judge-watch-{instance_id}")
        self.events.append({"event": "load", "instance": instance_id, "model": model,
                            "seconds": eng.load_s, "from_host": False})
        log.info("judge engine %s (%s) up in %.1fs on port %d", instance_id, model, eng.load_s,
                 eng.port)
        return eng.load_s

    def _argv(self, eng: _Engine) -> list[str]:
        o, m = eng.opts, eng.spec
        seqs = m.max_seqs or m.max_batch
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(m.path),
                "--served-model-name", m.name, "--host", "127.0.0.1", "--port", str(eng.port),
                "--max-model-len", str(o.max_model_len), "--max-num-seqs", str(seqs),
                "--dtype", m.dtype if m.dtype in ("float32", "float16", "bfloat16") else "auto",
                "--disable-log-stats", "--uvicorn-log-level", "warning"]
        if self.device == "cpu":
            # no torch.compile warm-up (tens of seconds on CPU), and the worker in the engine's
            # process (uni): one interpreter to start instead of three (with the env below)
            argv += ["--enforce-eager", "--distributed-executor-backend", "uni"]
        else:  # its KV cache sized as on CPU (`kv_cache_gb`), not 90% of the device: several
            # judges share one device (vLLM's --gpu-memory-utilization would take it whole)
            argv += ["--kv-cache-memory-bytes", str(int(o.kv_cache_gb * (1 << 30)))]
        if self.sleep_level:
            argv.append("--enable-sleep-mode")
        return [*argv, *o.extra_args]

    async def _start(self, eng: _Engine) -> None:
        if eng.spec.path is None:
            raise BrokenError(f"model {eng.spec.name}: a judge engine needs a path")
        eng.port = _free_port()
        eng.log_path = os.path.join(self._logs(), f"{eng.id}.log")
        env = dict(os.environ)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(eng.opts.kv_cache_gb)))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_DO_NOT_TRACK", "1")
        env["HF_HUB_OFFLINE"] = "1"
        if self.sleep_level:  # (/sleep and /wake_up are dev routes)
            env["VLLM_SERVER_DEV_MODE"] = "1"
        else:
            env.pop("VLLM_SERVER_DEV_MODE", None)
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in eng.devices)
        else:  # the engine core in the server's process (CPU: 34 s to start instead of 45-90)
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        with open(eng.log_path, "ab") as logf:
            eng.proc = await asyncio.create_subprocess_exec(
                *self._argv(eng), stdin=asyncio.subprocess.DEVNULL, stdout=logf,
                stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
        eng.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{eng.port}",
                                       timeout=httpx.Timeout(eng.opts.request_timeout_s,
                                                             connect=10.0),
                                       limits=httpx.Limits(max_connections=None,
                                                           max_keepalive_connections=64))
        deadline = time.monotonic() + eng.opts.start_timeout_s
        while True:
            if eng.proc.returncode is not None:
                raise BrokenError(f"judge engine {eng.id} ({eng.spec.name}) exited with "
                                  f"{eng.proc.returncode} while starting: {_tail(eng.log_path)}")
            if self._engines.get(eng.id) is not eng:
                raise BrokenError(f"instance {eng.id} was unloaded while it was loading")
            try:
                r = await eng.client.get("/health", timeout=2.0)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BrokenError(f"judge engine {eng.id} did not answer within "
                                  f"{eng.opts.start_timeout_s:g}s: {_tail(eng.log_path)}")
            await asyncio.sleep(0.25)

    async def _stop(self, eng: _Engine, *, kill: bool = False) -> None:
        """End the engine's process group (SIGTERM, then SIGKILL after 10 s; ``kill``: at once)."""
        proc = eng.proc
        if eng.client is not None:
            with contextlib.suppress(Exception):
                await eng.client.aclose()
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        # the engine's own children (EngineCore, workers) share its process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def unload(self, instance_id: str, park: bool = True) -> bool:
        """End the instance's engine, or with ``park`` where sleep mode is on, put it to sleep
        (True: a later ``load`` with ``from_host`` wakes it)."""
        eng = self._engines.pop(instance_id, None)
        if eng is None:
            return False
        t0 = time.perf_counter()
        if park and self.sleep_level and self.max_asleep and await self._sleep(eng):
            self.events.append({"event": "sleep", "instance": instance_id,
                                "model": eng.spec.name, "seconds": time.perf_counter() - t0,
                                "level": self.sleep_level})
            return True
        eng.state = "stopping"
        if eng.watch is not None:
            eng.watch.cancel()
        await self._stop(eng)
        self.events.append({"event": "unload", "instance": instance_id, "model": eng.spec.name,
                            "seconds": time.perf_counter() - t0, "parked": False,
                            "pid": eng.proc.pid if eng.proc is not None else None})
        return False

    async def _sleep(self, eng: _Engine) -> bool:
        """Put a loaded, idle engine to sleep (kept in `_asleep`, oldest ended past
        `max_asleep`); False, changing nothing, when it cannot."""
        if eng.state != "loaded" or eng.in_flight or eng.client is None or eng.dead:
            return False
        try:
            r = await eng.client.post("/sleep", params={"level": self.sleep_level}, timeout=120.0)
        except httpx.HTTPError as exc:
            log.warning("judge engine %s: sleep failed (%s): ended instead", eng.id, exc)
            return False
        if r.status_code != 200:
            log.warning("judge engine %s: sleep answered %d: ended instead", eng.id, r.status_code)
            return False
        if eng.watch is not None:
            eng.watch.cancel()
            eng.watch = None
        eng.state = "asleep"
        self._asleep[eng.id] = eng
        while len(self._asleep) > self.max_asleep:  # (the oldest asleep ends first)
            await self._stop(self._asleep.pop(next(iter(self._asleep))))
        return True

    async def _wake(self, instance_id: str, model: str,
                    devices: tuple[int, ...]) -> float | None:
        """Wake a sleeping engine of ``model`` on ``devices`` as ``instance_id`` (its own id
        first); measured seconds, or None (none there, or it would not wake: ended)."""
        picks = [e for e in self._asleep.values()
                 if e.spec.name == model and e.devices == devices]
        picks.sort(key=lambda e: e.id != instance_id)
        if not picks:
            return None
        eng = picks[0]
        del self._asleep[eng.id]
        t0 = time.perf_counter()
        assert eng.client is not None
        try:
            r = await eng.client.post("/wake_up", timeout=eng.opts.start_timeout_s)
            ok = r.status_code == 200 and r.json().get("status") == "awake"
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("judge engine %s: wake failed (%s): a new one starts", eng.id, exc)
            ok = False
        if not ok or eng.proc is None or eng.proc.returncode is not None:
            await self._stop(eng, kill=True)
            return None
        eng.id, eng.state, eng.from_host = instance_id, "loaded", True
        eng.load_s = time.perf_counter() - t0
        self._engines[instance_id] = eng
        eng.watch = asyncio.create_task(self._watch(eng), name=f"judge-watch-{instance_id}")
        self.events.append({"event": "wake", "instance": instance_id, "model": model,
                            "seconds": eng.load_s, "from_host": True})
        return eng.load_s

    async def run_batch(self, instance_id: str, actions: Sequence[ActionSpec]) -> BatchOutcome:
        """Send each action as its own request (the engine batches them continuously)."""
        if self._closed:
            raise ClosedError("the judge engine host is closed")
        eng = self._engines.get(instance_id)
        if eng is None or eng.state != "loaded":
            raise BrokenError(f"instance {instance_id} is not loaded on this node")
        t0 = time.perf_counter()
        eng.in_flight += len(actions)
        try:
            got = await asyncio.gather(*(self._one(eng, a) for a in actions))
        finally:
            eng.in_flight -= len(actions)
        if eng.dead:
            raise EngineDied(instance_id, eng.dead)
        outputs: dict[str, Outcome] = {}
        failed: dict[str, str] = {}
        for a, (out, reason) in zip(actions, got, strict=True):
            if out is not None:
                outputs[a.id] = out
            else:
                failed[a.id] = reason
        return BatchOutcome(outputs, failed, time.perf_counter() - t0, len(outputs))

    async def _one(self, eng: _Engine, a: ActionSpec) -> tuple[Outcome | None, str]:
        spec, opts = eng.spec, eng.opts
        if a.model is not None and a.model != spec.name:
            return None, f"action names model {a.model!r}; instance serves {spec.name!r}"
        try:
            req = judge_request(a.payload)  # (typed at the edge: itself)
            if req.route is not None:
                route, body = req.route, {**req.openai_body(), "model": spec.name}
            else:
                route, body = self._judge_request(spec, opts, req)
        except ValueError as exc:
            return None, f"bad payload: {exc}"
        assert eng.client is not None
        try:
            r = await eng.client.post(f"/v1/{route}", json=body)
        except httpx.HTTPError as exc:
            await self._check_alive(eng, f"{type(exc).__name__}: {exc}")
            return None, f"model {spec.name} failed: {type(exc).__name__}: {exc}"
        if r.status_code != 200:
            return None, f"model {spec.name} answered {r.status_code}: {r.text[:300]}"
        eng.served += 1
        data = r.json()
        data["model"] = spec.name
        if req.route is not None:
            return Completion.of(spec.name, route, data), ""
        return self._verdict(spec, opts, route, data)

    def _judge_request(self, spec: ModelSpec, opts: JudgeOptions,
                       req: JudgeRequest) -> tuple[str, dict[str, Any]]:
        got = judge_messages(spec, opts, req)
        body: dict[str, Any] = {"model": spec.name, "max_tokens": opts.max_tokens,
                                "temperature": opts.temperature}
        if opts.seed is not None:
            body["seed"] = opts.seed
        if isinstance(got, str):
            return "completions", {**body, "prompt": got}
        return "chat/completions", {**body, "messages": got}

    @staticmethod
    def _verdict(spec: ModelSpec, opts: JudgeOptions, route: str,
                 data: Mapping[str, Any]) -> tuple[JudgeVerdict | None, str]:
        choice = (data.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") if route.startswith("chat") \
            else choice.get("text")
        text = text or ""
        usage = data.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        finish = choice.get("finish_reason")
        v = parse(text, opts.verdict)
        if v is None and opts.on_no_verdict == "fail":
            shown = text[-120:].replace("\n", "\\n")
            return None, (f"model {spec.name}: no verdict (rule {opts.verdict.rule}) in "
                          f"{completion_tokens} generated tokens "
                          f"(finish_reason {finish}): ...{shown!r}")
        return JudgeVerdict(
            model=spec.name, reasoning=text, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, finish_reason=finish,
            score=v.score if v is not None else float(opts.on_no_verdict),
            verdict=v.found if v is not None else None), ""

    async def step_costs(self, instance_id: str, *, k: int = 32, tokens: int = 64,
                         repeats: int = 1) -> tuple[float, float, float, float]:
        """The engine's decode step ``alpha + beta * seqs`` (the simulator's engine model,
        `tangram calibrate`): ``n`` requests at once for ``n`` = 1, 2, 4, ... up to ``k`` (and
        ``k``), each generating exactly ``tokens`` (ignore_eos), each width ``repeats`` times;
        the per-step seconds (the batch's time over ``tokens``) fitted by `costs.fit_alpha_beta`
        (one point per width, its median; weighted for relative error). Returns (alpha, beta,
        s1, sk): the fit, and the medians at 1 and at ``k``. The first request warms the
        engine and is not counted."""
        eng = self._engines.get(instance_id)
        if eng is None or eng.state != "loaded" or eng.client is None or k < 2 or tokens < 1 \
                or repeats < 1:
            raise BrokenError(f"instance {instance_id} is not loaded (or k < 2, tokens < 1, "
                              f"repeats < 1)")
        client = eng.client
        body = {"model": eng.spec.name, "prompt": "calibrate", "max_tokens": tokens,
                "temperature": 0.0, "ignore_eos": True}

        async def one() -> None:
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()

        await one()
        widths = sorted({*(1 << i for i in range(k.bit_length()) if 1 << i <= k), k})
        samples: list[tuple[int, float]] = []
        for _ in range(repeats):
            for n in widths:
                t0 = time.perf_counter()
                await asyncio.gather(*(one() for _ in range(n)))
                samples.append((n, (time.perf_counter() - t0) / tokens))
        fit = fit_alpha_beta(samples, 2)
        assert fit is not None  # (two widths at least: k >= 2)
        s1 = statistics.median(y for n, y in samples if n == 1)
        sk = statistics.median(y for n, y in samples if n == k)
        return fit[0], fit[1], s1, sk

    # ---- supervision ---------------------------------------------------------------------
    async def _check_alive(self, eng: _Engine, seen: str) -> None:
        """A request failed: if the process is gone, the engine died."""
        proc = eng.proc
        if proc is None or eng.state != "loaded":
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 1.0)
        if proc.returncode is not None:
            await self._died(eng, f"engine process exited with {proc.returncode} ({seen})")

    async def _watch(self, eng: _Engine) -> None:
        """Until unloaded: the process's exit, and, while requests are in flight, its
        ``/health`` (no answer for ``hang_s``: hung)."""
        proc, client = eng.proc, eng.client
        assert proc is not None and client is not None
        waiter = asyncio.ensure_future(proc.wait())
        try:
            await self._watch_loop(eng, proc, client, waiter)
        finally:
            waiter.cancel()

    async def _watch_loop(self, eng: _Engine, proc: asyncio.subprocess.Process,
                          client: httpx.AsyncClient, waiter: asyncio.Future[int]) -> None:
        silent_since: float | None = None
        while eng.state == "loaded":
            if proc.returncode is not None:
                await self._died(eng, f"engine process exited with {proc.returncode}")
                return
            if eng.in_flight:
                try:
                    r = await client.get("/health", timeout=max(1.0, min(5.0, eng.opts.hang_s)))
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    silent_since = None
                else:
                    now = time.monotonic()
                    silent_since = silent_since or now
                    if now - silent_since >= eng.opts.hang_s:
                        await self._died(eng, f"engine hung: no /health answer for "
                                              f"{now - silent_since:.1f}s with {eng.in_flight} "
                                              "requests in flight")
                        return
            else:
                silent_since = None
            await asyncio.wait({waiter}, timeout=1.0)

    async def _died(self, eng: _Engine, cause: str) -> None:
        """Drop a dead or hung engine (killing its process group), tell ``on_worker_death``;
        its batches' calls then raise `EngineDied`."""
        if eng.dead or self._engines.get(eng.id) is not eng:
            return
        reason = f"the engine of judge instance {eng.id} ({eng.spec.name}) died: {cause}"
        eng.dead, eng.state = reason, "dead"
        del self._engines[eng.id]
        self.engine_deaths += 1
        self.last_engine_death = reason
        self.events.append({"event": "death", "instance": eng.id, "model": eng.spec.name,
                            "reason": reason})
        log.warning("%s; instance dropped", reason)
        hook = self.on_worker_death
        if hook is not None:
            try:
                hook(eng.id, reason)
            except Exception:
                log.exception("on_worker_death hook failed for %s", eng.id)
        await self._stop(eng, kill=True)  # (a hung one holds its requests: they now fail)

    def engine_pid(self, instance_id: str) -> int | None:
        """The pid (and process group) of an instance's engine (fault injection in tests)."""
        eng = self._engines.get(instance_id)
        return eng.proc.pid if eng is not None and eng.proc is not None else None

    def base_url(self, instance_id: str) -> str | None:
        eng = self._engines.get(instance_id)
        return f"http://127.0.0.1:{eng.port}" if eng is not None else None

    def health(self) -> dict[str, Any]:
        return {"judge_engine_deaths": self.engine_deaths,
                "last_judge_engine_death": self.last_engine_death}

    def resident(self) -> dict[str, dict[str, Any]]:
        return {iid: {"model": e.spec.name, "devices": e.devices, "state": e.state,
                      "from_host": e.from_host, "load_s": e.load_s, "engine": "vllm",
                      "pid": e.proc.pid if e.proc is not None else None,
                      "in_flight": e.in_flight}
                for iid, e in self._engines.items()}

    def _logs(self) -> str:
        """The directory of the engines' logs (our own temporary one made on first use)."""
        if self._log_dir is None:
            self._log_dir = self._own_log_dir = tempfile.mkdtemp(prefix="tangram-judge-")
        return self._log_dir

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for iid in list(self._engines):
            await self.unload(iid, park=False)
        while self._asleep:
            await self._stop(self._asleep.popitem()[1])
        if self._own_log_dir is not None:  # (a directory the caller named is the caller's)
            shutil.rmtree(self._own_log_dir, ignore_errors=True)

