"""Payload validation (managers/cpu/host/payload.py), rule by rule: what an action's payload may
say, what each field becomes in the sandbox request, and the exact error naming the field when
it may not (issue 27, mutation testing: `test_cpu_unit.py` checks one bad value per field; this
pins the boundaries, the defaults, the messages and the environment the code is given).

Everything here is in-process: `build_request` is the whole contract between an action and a
sandbox init (nothing untrusted reaches the init unchecked), so its return value is what to
assert on.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Mapping
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.host import payload as pl
from arl_tangram.managers.cpu.host.languages import Language

PY = Language("python", "main.py", None, None, "py")
CPP = Language("cpp", "main.cpp", ("/usr/bin/g++", "-O2", "{file}"), ("./main",), "g++")
GO = Language("go", "main.go", ("/opt/go/bin/go", "build", "{file}"), ("./main",), "go")
JAVA = Language("java", "Main.java", ("/opt/jdk/bin/javac", "{file}"), ("/opt/jdk/bin/java",
                                                                        "Main"), "java")
BASH = Language("bash", "main.sh", None, ("/bin/bash", "{file}"), "bash")
LANGS = {"python": PY, "cpp": CPP, "bash": BASH}
CFG = CpuManagerConfig(work_root="/tmp/x", sandbox_uid=4321, sandbox_gid=4322,
                       workdir_max_mb=64, max_open_files=77, output_limit_bytes=5000,
                       default_cpus=1.0, default_run_timeout_s=10.0,
                       default_compile_timeout_s=30.0, max_timeout_s=100.0,
                       default_memory_mb=512)
B64 = base64.b64encode(b"hi").decode()


def req(p: Any, kind: ActionKind = ActionKind.CODE, cpu: float = 2.0,
        cfg: CpuManagerConfig = CFG, langs: dict[str, Language] | None = None,
        **kw: Any) -> dict[str, Any]:
    a = ActionSpec(id="a", kind=kind, payload=p, **kw)
    return dict(pl.build_request(a, Resources(cpu=cpu, memory_mb=300),
                                 LANGS if langs is None else langs, cfg))


def refused(p: Any, kind: ActionKind = ActionKind.CODE, **kw: Any) -> tuple[str, str]:
    with pytest.raises(InvalidAction) as e:
        req(p, kind, **kw)
    return e.value.field, str(e.value)


# ---- the whole request ------------------------------------------------------------------------

def test_a_plain_code_action_becomes_this_request() -> None:
    r = req({"code": "print(1)"})
    env = pl.env_for(2.0, LANGS)
    assert r == {
        "op": "run", "lang": PY.wire(), "code": "print(1)", "stdin": "", "files": {},
        "fetch_files": [], "compile_timeout": 30.0, "run_timeout": 10.0, "env": env,
        "cases": None, "quota": 2.0, "stop_on_first_failure": False,
        "limits": {"uid": 4321, "gid": 4322, "cpu_s": 30 * 2 + 1, "fsize": 64 << 20,
                   "nofile": 77, "output": 5000, "cpus": 2.0}}


def test_every_field_given_is_carried() -> None:
    r = req({"code": "int main(){}", "language": "cpp", "stdin": "in\n",
             "files": {"./d/../a.txt": B64}, "fetch_files": ["/workdir/out/x.txt", "y"],
             "compile_timeout": 7, "run_timeout": 2.5, "stop_on_first_failure": True}, cpu=1.0)
    assert r["lang"] == CPP.wire() and r["code"] == "int main(){}" and r["stdin"] == "in\n"
    assert r["files"] == {"a.txt": B64} and r["fetch_files"] == ["out/x.txt", "y"]
    assert r["compile_timeout"] == 7.0 and r["run_timeout"] == 2.5
    assert r["stop_on_first_failure"] is True and r["limits"]["cpu_s"] == 7 * 1 + 1


def test_none_means_the_default() -> None:
    r = req({"code": "x", "language": None, "stdin": None, "files": None, "fetch_files": None,
             "run_timeout": None, "compile_timeout": None, "stop_on_first_failure": None})
    assert r == req({"code": "x"})


def test_a_payload_that_is_not_an_object() -> None:
    assert refused(["code"]) == ("payload", "payload: must be an object")


def test_code_is_required_and_a_string() -> None:
    assert refused({}) == ("payload.code", "payload.code: is required (a string)")
    assert refused({"code": None})[0] == "payload.code"
    assert refused({"code": 5}) == ("payload.code", "payload.code: expected str, got int")


def test_wrong_types_name_what_was_expected() -> None:
    assert refused({"code": "x", "language": 3}) == (
        "payload.language", "payload.language: expected str, got int")
    assert refused({"code": "x", "run_timeout": "3"}) == (
        "payload.run_timeout", "payload.run_timeout: expected int or float, got str")
    assert refused({"code": "x", "files": []}) == (
        "payload.files", "payload.files: expected dict, got list")
    assert refused({"code": "x", "fetch_files": "a"})[0] == "payload.fetch_files"
    assert refused({"code": "x", "stop_on_first_failure": 1}) == (
        "payload.stop_on_first_failure", "payload.stop_on_first_failure: expected bool, got int")


@pytest.mark.parametrize("field", ["run_timeout", "compile_timeout"])
def test_true_is_not_a_number(field: str) -> None:
    assert refused({"code": "x", field: True}) == (
        f"payload.{field}", f"payload.{field}: expected int or float, got bool")


# ---- text -------------------------------------------------------------------------------------

def test_any_unicode_text_passes_unchanged() -> None:
    code = "print('héllo ✓ 𝄞')"
    r = req({"code": code, "stdin": "ünïcode\n"})
    assert r["code"] == code and r["stdin"] == "ünïcode\n"


def test_a_lone_surrogate_is_refused_naming_field_and_place() -> None:
    assert refused({"code": "ab\ud800c"}) == (
        "payload.code", "payload.code: not valid text: a lone surrogate '\\ud800' at index 2 "
        "cannot be encoded as UTF-8")
    assert refused({"code": "x", "stdin": "é\udfff"})[0] == "payload.stdin"


# ---- timeouts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("v", [0, -1, 0.0, float("nan"), float("inf"), -float("inf")])
def test_a_timeout_must_be_a_positive_finite_number(v: float) -> None:
    field, text = refused({"code": "x", "run_timeout": v})
    assert field == "payload.run_timeout" and "must be a positive number, got" in text
    assert refused({"code": "x", "compile_timeout": v})[0] == "payload.compile_timeout"


def test_timeouts_are_capped_and_default_to_the_action_s_own() -> None:
    r = req({"code": "x", "run_timeout": 1e9, "compile_timeout": 100.5})
    assert r["run_timeout"] == 100.0 and r["compile_timeout"] == 100.0  # max_timeout_s
    assert req({"code": "x", "run_timeout": 100})["run_timeout"] == 100.0
    assert req({"code": "x", "run_timeout": 0.001})["run_timeout"] == 0.001
    assert req({"code": "x"}, timeout_s=4.0)["run_timeout"] == 4.0  # the action's, if shorter
    assert req({"code": "x"}, timeout_s=40.0)["run_timeout"] == 10.0


def test_cpu_seconds_cover_the_longest_stage_on_every_core_shown() -> None:
    assert req({"code": "x", "run_timeout": 2, "compile_timeout": 3}, cpu=1)["limits"][
        "cpu_s"] == 4
    assert req({"code": "x", "run_timeout": 50, "compile_timeout": 3}, cpu=1)["limits"][
        "cpu_s"] == 51
    assert req({"code": "x", "run_timeout": 2.2, "compile_timeout": 1}, cpu=1)["limits"][
        "cpu_s"] == 4  # ceil(2.2) + 1
    assert req({"code": "x", "run_timeout": 2, "compile_timeout": 1}, cpu=0.5)["limits"][
        "cpu_s"] == 3  # at least one core's worth
    assert req({"code": "x", "run_timeout": 2, "compile_timeout": 1}, cpu=1.5)["limits"][
        "cpu_s"] == 4


# ---- paths and files --------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "norm"), [
    ("a.txt", "a.txt"), ("./a.txt", "a.txt"), ("d/../a.txt", "a.txt"), ("d//e/./f", "d/e/f"),
    ("/workdir/a/b.txt", "a/b.txt"), ("/workdir/a/../b", "b"), ("..a", "..a"), ("a/..b", "a/..b"),
])
def test_paths_inside_the_work_directory(path: str, norm: str) -> None:
    assert req({"code": "x", "fetch_files": [path]})["fetch_files"] == [norm]
    assert req({"code": "x", "files": {path: B64}})["files"] == {norm: B64}


@pytest.mark.parametrize("path", [
    "", ".", "./", "..", "../x", "a/../..", "a/../../x", "/etc/passwd", "/workdir", "/workdir/",
    "/workdir/..", "/workdir/../etc", "/workdirx/a", "/tmp/a", "//workdir/a",
])
def test_paths_outside_are_refused(path: str) -> None:
    field, text = refused({"code": "x", "fetch_files": [path]})
    assert field == "payload.fetch_files"
    assert text == (f"payload.fetch_files: file path must be a non-empty string, got {path!r}"
                    if not path else
                    f"payload.fetch_files: path {path!r} must stay inside the work directory")
    assert refused({"code": "x", "files": {path: B64}})[0] == "payload.files"


def test_a_path_that_is_not_a_string() -> None:
    assert refused({"code": "x", "fetch_files": [3]}) == (
        "payload.fetch_files", "payload.fetch_files: file path must be a non-empty string, got 3")
    assert refused({"code": "x", "fetch_files": [None]})[0] == "payload.fetch_files"


def test_file_contents_must_be_base64_text() -> None:
    assert refused({"code": "x", "files": {"a": 5}}) == (
        "payload.files", "payload.files: content of 'a' must be base64 text")
    field, text = refused({"code": "x", "files": {"a": "aGk"}})  # padding missing
    assert field == "payload.files" and text.startswith("payload.files: content of 'a' is not "
                                                        "base64: ")
    assert refused({"code": "x", "files": {"a": "aGk=\n"}})[0] == "payload.files"  # strict
    assert refused({"code": "x", "files": {"a": "é"}})[0] == "payload.files"  # non-ASCII
    two = {"a": B64, "d/b": base64.b64encode(b"\0\xff").decode(), "e": ""}
    assert req({"code": "x", "files": two})["files"] == two  # (empty content is a file too)


# ---- cases ------------------------------------------------------------------------------------

def test_a_test_action_needs_a_non_empty_list_of_cases() -> None:
    msg = "payload.cases: a TEST action needs a non-empty list of cases"
    assert refused({"code": "x"}, ActionKind.TEST) == ("payload.cases", msg)
    assert refused({"code": "x", "cases": []}, ActionKind.TEST) == ("payload.cases", msg)
    assert refused({"code": "x", "cases": None}, ActionKind.TEST) == ("payload.cases", msg)
    assert refused({"code": "x", "cases": {"a": 1}}, ActionKind.TEST) == (
        "payload.cases", "payload.cases: expected list, got dict")


def test_cases_become_asserts_or_stdin_and_expected_output() -> None:
    cases = [{"assert": "f(1) == 2"}, {"stdin": "1\n", "expected_stdout": "2\n"},
             {"stdin": "3\n"}, {}, {"expected_stdout": "ok", "stdin": "", "extra": 1},
             {"assert": "g()", "stdin": "ignored"}]
    r = req({"code": "x", "cases": cases}, ActionKind.TEST)
    assert r["cases"] == [{"assert": "f(1) == 2"}, {"stdin": "1\n", "expected_stdout": "2\n"},
                          {"stdin": "3\n", "expected_stdout": None},
                          {"stdin": "", "expected_stdout": None},
                          {"stdin": "", "expected_stdout": "ok"}, {"assert": "g()"}]
    assert req({"code": "x", "cases": cases})["cases"] is None  # only a TEST action has cases


def test_a_bad_case_is_named_by_its_index() -> None:
    def bad(cases: list[Any], lang: str = "python") -> tuple[str, str]:
        return refused({"code": "x", "language": lang, "cases": cases}, ActionKind.TEST)

    ok = {"stdin": ""}
    assert bad([ok, "1"]) == ("payload.cases[1]", "payload.cases[1]: each case must be an object")
    assert bad([ok, ok, {"assert": "1"}], "cpp") == (
        "payload.cases[2].assert", "payload.cases[2].assert: assert cases need python")
    assert bad([{"assert": 1}]) == ("payload.cases[0].assert",
                                    "payload.cases[0].assert: must be a string")
    both = "payload.cases[0]: stdin and expected_stdout must be strings"
    assert bad([{"stdin": 1}]) == ("payload.cases[0]", both)
    assert bad([{"stdin": None}]) == ("payload.cases[0]", both)
    assert bad([{"expected_stdout": 2}]) == ("payload.cases[0]", both)
    assert bad([{"assert": "a\ud800"}])[0] == "payload.cases[0].assert"
    assert bad([ok, {"stdin": "\udc00"}])[0] == "payload.cases[1].stdin"
    assert bad([{"expected_stdout": "x\ud800"}])[0] == "payload.cases[0].expected_stdout"


# ---- languages and sessions -------------------------------------------------------------------

def test_an_unavailable_language_says_why_and_what_is_there() -> None:
    assert refused({"code": "x", "language": "go"}) == (
        "payload.language", "payload.language: language 'go' unavailable: its toolchain is not "
        "installed here; available: ['bash', 'cpp', 'python']")
    assert refused({"code": "x", "language": "cobol"}) == (
        "payload.language", "payload.language: language 'cobol' unavailable: unknown; "
        "available: ['bash', 'cpp', 'python']")


def test_a_session_runs_python_or_bash_only() -> None:
    assert req({"code": "x"}, ActionKind.TOOL, session="s")["op"] == "session"
    assert req({"code": "x", "language": "bash"}, ActionKind.TOOL, session="s")["op"] == "session"
    assert refused({"code": "x", "language": "cpp"}, ActionKind.TOOL, session="s") == (
        "payload.language", "payload.language: session actions run python or bash, not 'cpp'")
    assert refused({"code": "x", "language": "cobol"}, ActionKind.TOOL, session="s")[1] == (
        "payload.language: session actions run python or bash, not 'cobol'")
    # a session's other kinds, and a tool call outside any session, are one-shot runs
    assert req({"code": "x", "language": "cpp"}, ActionKind.CODE, session="s")["op"] == "run"
    assert req({"code": "x", "language": "cpp"}, ActionKind.TOOL)["op"] == "run"


# ---- cores, memory, environment ---------------------------------------------------------------

def test_no_cpu_in_the_allotment_means_the_default() -> None:
    cfg = CpuManagerConfig(work_root="/tmp/x", default_cpus=3.0)
    r = req({"code": "x"}, cpu=0.0, cfg=cfg)
    assert r["quota"] == 3.0 and r["limits"]["cpus"] == 3.0 and r["env"]["TANGRAM_CPUS"] == "3"
    allotments: list[Mapping[str, float]] = [Resources(memory_mb=300), {}]
    for alloc in allotments:  # (an allotment without cores at all)
        r = dict(pl.build_request(ActionSpec(id="a", payload={"code": "x"}), alloc, LANGS, cfg))
        assert r["quota"] == 3.0 and r["limits"]["cpus"] == 3.0


def test_an_elastic_action_is_shown_its_maximum_from_the_start() -> None:
    r = req({"code": "x"}, cpu=1.0, elasticity=Elasticity(1, 64))
    n = pl.machine_cpus()
    assert r["quota"] == 1.0 and r["limits"]["cpus"] == n
    assert r["limits"]["cpu_s"] == math.ceil(30 * n) + 1


def test_machine_cpus_are_the_ones_this_process_may_use() -> None:
    assert pl.machine_cpus() == len(os.sched_getaffinity(0))


def test_memory_comes_from_the_allotment_capped_by_the_payload() -> None:
    def typed(p: dict[str, Any]) -> Any:  # (the typed request the manager reads it from)
        return pl.request_of(ActionSpec(id="a", payload={"code": "x", **p}))

    def mb(p: dict[str, Any], alloc: float) -> float:
        return pl.memory_bytes(typed(p), {"memory_mb": alloc}, CFG) / (1 << 20)

    assert mb({}, 300) == 300 and mb({}, 0) == 512  # none allotted: the default
    assert mb({"memory_limit_MB": 100}, 300) == 100 and mb({"memory_limit_MB": 900}, 300) == 300
    assert mb({"memory_limit_MB": 100.5}, 300) == 100.5
    assert mb({"memory_limit_MB": 1}, 300) == 1 and mb({"memory_limit_MB": 0.5}, 300) == 0.5
    assert mb({"memory_limit_MB": 0}, 300) == 300 and mb({"memory_limit_MB": -1}, 300) == 300
    assert mb({"memory_limit_MB": None}, 300) == 300
    assert pl.memory_bytes(typed({}), {}, CFG) == 512 << 20
    assert isinstance(pl.memory_bytes(typed({"memory_limit_MB": 1.5}), {}, CFG), int)
    with pytest.raises(InvalidAction) as e:
        pl.memory_bytes(typed({"memory_limit_MB": "1"}), {}, CFG)
    assert e.value.field == "payload.memory_limit_MB"


def test_the_tmpfs_is_half_the_memory_at_most_the_workdir_cap() -> None:
    cfg = CpuManagerConfig(work_root="/tmp/x", workdir_max_mb=256)
    assert pl.tmpfs_mb(128 << 20, cfg) == 64 and pl.tmpfs_mb(129 << 20, cfg) == 64
    assert pl.tmpfs_mb(130 << 20, cfg) == 65
    assert pl.tmpfs_mb(512 << 20, cfg) == 256 and pl.tmpfs_mb(4 << 30, cfg) == 256
    assert pl.tmpfs_mb(1 << 20, cfg) == 1 and pl.tmpfs_mb(0, cfg) == 1  # never 0


@pytest.mark.parametrize(("cpus", "shown", "threads"), [
    (0.25, "0.25", "1"), (1.0, "1", "1"), (1.0000000001, "1", "1"), (1.5, "1.5", "2"),
    (2.0, "2", "2"), (3.2, "3.2", "4"), (16.0, "16", "16"),
])
def test_the_environment_of_the_code(cpus: float, shown: str, threads: str) -> None:
    env = pl.env_for(cpus, {"python": PY})
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workdir", "TMPDIR": "/tmp",
                   "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TANGRAM_CPUS": shown,
                   "OMP_NUM_THREADS": threads, "PYTHONDONTWRITEBYTECODE": "1",
                   "GOCACHE": "/tmp/.gocache", "GOPATH": "/tmp/.gopath"}


def test_toolchain_directories_come_first_on_the_path_once_each() -> None:
    langs = {"python": PY, "cpp": CPP, "go": GO, "java": JAVA, "bash": BASH}
    assert pl.env_for(1, langs)["PATH"] == (
        "/opt/go/bin:/opt/jdk/bin:/usr/local/bin:/usr/bin:/bin")  # /usr/bin, /bin: already there
    rel = Language("x", "x", ("cc", "{file}"), ("bin/run",), "relative argv")
    assert pl.env_for(1, {"x": rel})["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_the_environment_memo_gives_copies_and_stays_bounded() -> None:
    cache: dict[float, dict[str, str]] = {}
    a = pl._env(2.0, LANGS, cache)
    a["PATH"] = "/evil"
    b = pl._env(2.0, LANGS, cache)
    assert b == pl.env_for(2.0, LANGS) and b is not cache[2.0] and list(cache) == [2.0]
    for i in range(1, 70):
        assert pl._env(2.0 + i / 100, LANGS, cache)["TANGRAM_CPUS"] == f"{2.0 + i / 100:g}"
        assert len(cache) <= 64
    assert len(cache) == 64 and 2.0 not in cache and 2.69 in cache  # the oldest went first
    assert pl._env(1.0, LANGS, None) == pl.env_for(1.0, LANGS)  # no memo


def test_the_environment_memo_builds_each_core_count_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[float] = []
    real = pl.env_for

    def counting(cpus: float, langs: Any) -> dict[str, str]:
        built.append(cpus)
        return real(cpus, langs)

    monkeypatch.setattr(pl, "env_for", counting)
    cache: dict[float, dict[str, str]] = {}
    envs = [pl._env(c, LANGS, cache) for c in (2.0, 1.0, 2.0, 2.0, 1.0)]
    assert built == [2.0, 1.0] and envs[2] == envs[0] == real(2.0, LANGS)
    pl._env(2.0, LANGS, None)
    assert built == [2.0, 1.0, 2.0]  # (without a memo: built every time)
    env_cache: dict[float, dict[str, str]] = {}
    r = pl.build_request(ActionSpec(id="a", payload={"code": "x"}), Resources(cpu=2.0), LANGS,
                         CFG, env_cache)
    assert r["env"] == pl.env_for(2.0, LANGS) and list(env_cache) == [2.0]
