"""Toolchain detection (`host/languages.py`) with fake toolchains (issue 43, mutation testing):
each language's file, compile and run argv, description and read-only paths, exactly; a
language whose toolchain is missing is left out. No compiler runs: `_which` and `_version` are
fakes (`_version` itself runs the test's own interpreter)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.managers.cpu.host import languages as lg
from arl_tangram.managers.cpu.zygote.server import sandbox_path


def test_search_path_and_the_list() -> None:
    assert lg._SEARCH.split(os.pathsep)[-5:] == [
        "/usr/local/bin",
        "/usr/bin",
        "/bin",
        os.path.expanduser("~/.cargo/bin"),
        "/usr/local/go/bin",
    ]
    assert lg._SEARCH.startswith(os.environ.get("PATH", "") + os.pathsep)
    assert lg.ALL_LANGUAGES == (
        "python",
        "pytest",
        "bash",
        "cpp",
        "c",
        "nodejs",
        "java",
        "rust",
        "go",
    )


def test_which_searches_the_extended_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(lg, "_SEARCH", f"/nonexistent{os.pathsep}{tmp_path}")
    assert lg._which("mytool") == str(tool)
    assert lg._which("no-such-tool-here") is None


def test_wire() -> None:
    c = lg.Language("c", "main.c", ("/g", "{file}"), ("./main",), "gcc 1", ("/x",))
    assert c.wire() == {
        "name": "c",
        "file": "main.c",
        "compile": ["/g", "{file}"],
        "run": ["./main"],
        "inproc": False,
    }
    py = lg.Language("python", "main.py", None, None)
    assert py.description == "" and py.ro_paths == ()
    assert py.wire() == {
        "name": "python",
        "file": "main.py",
        "compile": None,
        "run": None,
        "inproc": True,
    }


async def test_version_first_line_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    py = sys.executable
    assert await lg._version([py, "-c", "print('  v 1.2  '); print('second')"]) == "v 1.2  "
    assert await lg._version([py, "-c", "import sys; sys.stderr.write('err 3\\n')"]) == "err 3"
    assert await lg._version([py, "-c", "pass"]) == ""
    assert await lg._version(["/nonexistent/tool", "--version"]) == ""
    assert (
        await lg._version([py, "-c", "import sys; sys.stdout.buffer.write(b'\\xff ok')"])
        == "\ufffd ok"
    )
    # the input is closed: a tool that reads it ends at once
    assert await lg._version([py, "-c", "import sys; print(repr(sys.stdin.read()))"]) == "''"
    limits: list[Any] = []
    real = asyncio.wait_for

    async def wait_for(aw: Any, timeout: float) -> Any:
        limits.append(timeout)
        if len(limits) == 2:
            await aw  # (the tool ends: no process left behind)
            raise TimeoutError
        return await real(aw, timeout)

    monkeypatch.setattr(lg.asyncio, "wait_for", wait_for)
    assert await lg._version([py, "-c", "print(1)"]) == "1"
    assert await lg._version([py, "-c", "print(1)"]) == ""
    assert limits == [20, 20] and lg.VERSION_TIMEOUT_S == 20.0


async def test_version_of_a_hung_tool_is_killed_and_reaped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tool that never answers gives "" after the limit, and is gone: killed, not left to
    hang beside the manager (its pid file names a process that no longer exists)."""
    monkeypatch.setattr(lg, "VERSION_TIMEOUT_S", 0.3)
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    # (within seconds: without the kill, the wait for its exit would last the tool's minute)
    assert await asyncio.wait_for(lg._version([sys.executable, "-c", code]), 10) == ""
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # reaped: not even a zombie holds the pid
        os.kill(pid, 0)


def test_python_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setattr(sys, "prefix", "/usr")
    assert lg.python_paths() == ("/usr",)  # (only what is under /usr/ is left out)
    monkeypatch.setattr(sys, "base_prefix", "/usr/lib/py")
    monkeypatch.setattr(sys, "prefix", "/usr/lib/py")
    assert lg.python_paths() == ()
    monkeypatch.setattr(sys, "prefix", "/venv/b")
    assert lg.python_paths() == ("/venv/b",)
    monkeypatch.setattr(sys, "base_prefix", "/opt/py")
    assert lg.python_paths() == ("/opt/py", "/venv/b")
    monkeypatch.setattr(sys, "prefix", "/opt/py")
    assert lg.python_paths() == ("/opt/py",)
    monkeypatch.setattr(sys, "prefix", "/usr/local")
    monkeypatch.setattr(sys, "base_prefix", "/usr/local")
    assert lg.python_paths() == ()


def _exe(p: Path) -> str:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return str(p)


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    tools: dict[str, str | None] = {}
    versions: dict[tuple[str, ...], str] = {}
    calls: list[list[str]] = []

    async def version(argv: list[str]) -> str:
        calls.append(list(argv))
        return versions.get(tuple(argv), "")

    monkeypatch.setattr(lg, "_which", lambda cmd: tools.get(cmd))
    monkeypatch.setattr(lg, "_version", version)
    monkeypatch.setattr(sys, "base_prefix", "/opt/base")
    monkeypatch.setattr(sys, "prefix", "/opt/venv")
    return {"tools": tools, "versions": versions, "calls": calls, "root": tmp_path}


async def test_only_python_when_nothing_else(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/py")
    fake["versions"][("/nonexistent/py", "-m", "pytest", "--version")] = "no such module"
    found = await lg.detect()
    assert list(found) == ["python"]
    v = sys.version.split()[0]
    assert found["python"] == lg.Language(
        "python", "main.py", None, None, f"python {v} (fork server)", ("/opt/base", "/opt/venv")
    )


async def test_every_toolchain_found(fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    root: Path = fake["root"]
    tools, versions = fake["tools"], fake["versions"]
    _exe(root / "pyenv" / "bin" / "python3.11")
    py = str(root / "pyenv" / "bin" / "python")
    os.symlink("python3.11", py)  # (pytest runs as the interpreter is named: not resolved)
    monkeypatch.setattr(sys, "executable", py)
    versions[(py, "-m", "pytest", "--version")] = "pytest 8.0.0"
    real_bash = _exe(root / "tc" / "bin" / "bash-5")
    os.symlink(real_bash, root / "tc" / "bin" / "bash")
    tools["bash"] = str(root / "tc" / "bin" / "bash")
    versions[(real_bash, "--version")] = "GNU bash 5\nmore"
    tools["g++"] = _exe(root / "gcc" / "bin" / "g++")
    versions[(tools["g++"], "--version")] = "g++ 12"
    tools["gcc"] = _exe(root / "gcc" / "bin" / "gcc")
    versions[(tools["gcc"], "--version")] = "gcc 12"
    tools["node"] = _exe(root / "node" / "bin" / "node")  # no version: named by itself
    tools["go"] = _exe(root / "go" / "bin" / "go")
    versions[(tools["go"], "version")] = "go1.22"
    tools["javac"] = _exe(root / "jdk" / "bin" / "javac")
    tools["java"] = _exe(root / "jdk" / "bin" / "java")
    versions[(tools["javac"], "-version")] = "javac 21"
    sysroot = root / "rust"
    rustc = _exe(sysroot / "bin" / "rustc")
    tools["rustc"] = str(root / "shim" / "rustc")
    versions[(tools["rustc"], "--print", "sysroot")] = f"  {sysroot}  \n"
    versions[(rustc, "--version")] = "rustc 1.80"
    found = await lg.detect()
    assert list(found) == ["python", "pytest", "bash", "cpp", "c", "nodejs", "go", "java", "rust"]
    assert found["pytest"] == lg.Language(
        "pytest",
        "test_main.py",
        None,
        (sandbox_path(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "{file}"),
        "pytest 8.0.0",
        ("/opt/base", "/opt/venv"),
    )
    assert found["bash"] == lg.Language(
        "bash", "main.sh", None, (real_bash, "{file}"), "GNU bash 5\nmore", (str(root / "tc"),)
    )
    assert found["cpp"] == lg.Language(
        "cpp",
        "main.cpp",
        (tools["g++"], "-O2", "-std=c++17", "-o", "main", "{file}"),
        ("./main",),
        "g++ 12",
        (str(root / "gcc"),),
    )
    assert found["c"] == lg.Language(
        "c",
        "main.c",
        (tools["gcc"], "-O2", "-o", "main", "{file}", "-lm"),
        ("./main",),
        "gcc 12",
        (str(root / "gcc"),),
    )
    assert found["nodejs"] == lg.Language(
        "nodejs", "main.js", None, (tools["node"], "{file}"), "nodejs", (str(root / "node"),)
    )
    assert found["go"] == lg.Language(
        "go",
        "main.go",
        (tools["go"], "build", "-o", "main", "{file}"),
        ("./main",),
        "go1.22",
        (str(root / "go"),),
    )
    assert found["java"] == lg.Language(
        "java",
        "Main.java",
        (tools["javac"], "-J-Xshare:auto", "{file}"),
        (tools["java"], "-Xss64m", "-XX:+UseSerialGC", "-cp", ".", "{stem}"),
        "javac 21",
        (str(root / "jdk"),),
    )
    assert found["rust"] == lg.Language(
        "rust",
        "main.rs",
        (rustc, "-O", "-o", "main", "{file}"),
        ("./main",),
        "rustc 1.80",
        (str(sysroot),),
    )
    assert sorted(fake["calls"]) == sorted(
        [
            [py, "-m", "pytest", "--version"],
            [real_bash, "--version"],
            [tools["g++"], "--version"],
            [tools["gcc"], "--version"],
            [tools["node"], "--version"],
            [tools["go"], "version"],
            [tools["javac"], "-version"],
            [tools["rustc"], "--print", "sysroot"],
            [rustc, "--version"],
        ]
    )


async def test_system_toolchains_need_no_extra_paths(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/py")
    tools, versions = fake["tools"], fake["versions"]
    real = os.path.realpath

    def realpath(p: str) -> str:
        return p if p.startswith(("/usr/", "/bin/")) else real(p)

    monkeypatch.setattr(lg.os.path, "realpath", realpath)
    tools["bash"] = "/bin/bash"
    tools["node"] = "/usr/bin/node"
    tools["javac"] = "/usr/lib/jvm/j/bin/javac"
    tools["java"] = "/usr/lib/jvm/j/bin/java"
    versions[("/bin/bash", "--version")] = "bash"
    found = await lg.detect()
    assert list(found) == ["python", "bash", "nodejs", "java"]
    assert found["bash"].ro_paths == () and found["nodejs"].ro_paths == ()
    assert found["java"].ro_paths == ()
    assert found["java"].description == "java"


async def test_java_needs_both_tools(fake: dict[str, Any]) -> None:
    root: Path = fake["root"]
    fake["tools"]["javac"] = _exe(root / "jdk" / "bin" / "javac")
    assert lg._java() is None
    del fake["tools"]["javac"]
    fake["tools"]["java"] = _exe(root / "jdk" / "bin" / "java")
    assert lg._java() is None


async def test_rust(fake: dict[str, Any]) -> None:
    root: Path = fake["root"]
    tools, versions = fake["tools"], fake["versions"]
    assert await lg._rust() is None
    assert fake["calls"] == []
    # no sysroot printed: rustc itself, no extra path
    tools["rustc"] = _exe(root / "r" / "bin" / "rustc")
    versions[(tools["rustc"], "--version")] = "rustc 1"
    assert await lg._rust() == lg.Language(
        "rust",
        "main.rs",
        (tools["rustc"], "-O", "-o", "main", "{file}"),
        ("./main",),
        "rustc 1",
        (),
    )
    # a sysroot without its rustc: none
    versions[(tools["rustc"], "--print", "sysroot")] = str(root / "empty")
    assert await lg._rust() is None
    # a rustc that is not there: none
    tools["rustc"] = str(root / "nothing" / "rustc")
    assert await lg._rust() is None
