"""Languages the CPU manager runs, and detection of their toolchains at start-up.

Invariant: a language is offered only when its toolchain was found on this machine; every
command is an absolute path that is visible inside the sandbox (its directory is bound read-only
into the sandbox view), so nothing depends on the sandbox's PATH to find a compiler.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, TypedDict

from ..zygote.server import sandbox_path

_SEARCH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/bin", "/usr/bin", "/bin",
     os.path.expanduser("~/.cargo/bin"), "/usr/local/go/bin"])


class LangWire(TypedDict):
    """A language as a sandbox request carries it (`Language.wire`)."""

    name: str  # "python", "bash", "cpp", ...
    file: str  # the code's file name in the sandbox's work directory
    compile: list[str] | None  # argv template of the compile stage ({file}, {stem}), or None
    run: list[str] | None  # argv template of the run stage; None: Python in the forked child
    inproc: bool  # run is None: the code runs in a fork of the sandbox's own interpreter


@dataclass(frozen=True, slots=True)
class Language:
    """How to build and run one language inside a sandbox."""

    name: str
    file: str  # source file name ({stem} of it is used in commands)
    compile: tuple[str, ...] | None  # argv template of the compile stage, or None
    run: tuple[str, ...] | None  # argv template of the run stage; None = in-process Python
    description: str = ""  # toolchain and version, for `languages()`
    ro_paths: tuple[str, ...] = ()  # host directories the toolchain needs inside the sandbox

    def wire(self) -> LangWire:
        return {"name": self.name, "file": self.file,
                "compile": list(self.compile) if self.compile else None,
                "run": list(self.run) if self.run else None, "inproc": self.run is None}


def _which(cmd: str) -> str | None:
    return shutil.which(cmd, path=_SEARCH)


VERSION_TIMEOUT_S = 20.0  # a toolchain's version query past this is a toolchain not offered


async def _version(argv: list[str]) -> str:
    """The first line a tool prints for ``argv`` (its version), or "" when it cannot run or
    answers nothing within `VERSION_TIMEOUT_S`: then it is killed and reaped, never left to
    hang beside the manager."""
    try:
        p = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL)
    except OSError:
        return ""
    try:
        out, _ = await asyncio.wait_for(p.communicate(), VERSION_TIMEOUT_S)
    except TimeoutError:
        if p.returncode is None:
            p.kill()
        await p.wait()
        return ""
    lines = out.decode(errors="replace").strip().splitlines()
    return lines[0] if lines else ""


def python_paths() -> tuple[str, ...]:
    """The interpreter's installation (and virtualenv) directories."""
    paths = {os.path.realpath(sys.base_prefix), sys.prefix}
    return tuple(sorted(p for p in paths if not p.startswith("/usr/")))


async def _rust() -> Language | None:
    rustc = _which("rustc")
    if rustc is None:
        return None
    sysroot = (await _version([rustc, "--print", "sysroot"])).strip()
    real = os.path.join(sysroot, "bin", "rustc") if sysroot else rustc
    if not os.path.exists(real):
        return None
    return Language("rust", "main.rs", (real, "-O", "-o", "main", "{file}"), ("./main",),
                    await _version([real, "--version"]), (sysroot,) if sysroot else ())


async def detect() -> dict[str, Language]:
    """Find every supported toolchain; absent ones are simply not in the result."""
    py = sys.executable
    found: dict[str, Language] = {
        "python": Language("python", "main.py", None, None, f"python {sys.version.split()[0]}"
                           " (fork server)", python_paths()),
    }
    cands: list[tuple[str, str, str, tuple[str, ...] | None, tuple[str, ...], list[str]]] = [
        ("pytest", py, "test_main.py", None,
         (sandbox_path(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "{file}"), ["-m", "pytest", "--version"]),
        ("bash", "bash", "main.sh", None, ("{tool}", "{file}"), ["--version"]),
        ("cpp", "g++", "main.cpp", ("{tool}", "-O2", "-std=c++17", "-o", "main", "{file}"),
         ("./main",), ["--version"]),
        ("c", "gcc", "main.c", ("{tool}", "-O2", "-o", "main", "{file}", "-lm"), ("./main",),
         ["--version"]),
        ("nodejs", "node", "main.js", None, ("{tool}", "{file}"), ["--version"]),
        ("go", "go", "main.go", ("{tool}", "build", "-o", "main", "{file}"), ("./main",),
         ["version"]),
    ]
    jobs = {}
    for name, tool, file, comp, run, vargs in cands:
        path = tool if os.path.isabs(tool) else _which(tool)
        if path is None:
            continue
        path = os.path.realpath(path) if name not in ("pytest",) else path

        def sub(t: tuple[str, ...] | None, p: str = path) -> tuple[str, ...] | None:
            return tuple(a.replace("{tool}", p) for a in t) if t else None

        extra: tuple[str, ...] = () if path.startswith(("/usr/", "/bin/")) else (os.path.dirname(os.path.dirname(path)),)
        if name == "pytest":
            extra = python_paths()
        jobs[name] = (Language(name, file, sub(comp), sub(run), "", extra), [path, *vargs])
    java = _java()
    if java is not None:
        jobs["java"] = java
    versions: list[Any] = list(await asyncio.gather(*(_version(v) for _, v in jobs.values()),
                                                   _rust()))
    for (name, (lang, _)), desc in zip(jobs.items(), versions[:-1], strict=True):
        if name == "pytest" and "pytest" not in desc:
            continue
        found[name] = Language(lang.name, lang.file, lang.compile, lang.run, desc or lang.name,
                               lang.ro_paths)
    if versions[-1] is not None:
        found["rust"] = versions[-1]
    return found


def _java() -> tuple[Language, list[str]] | None:
    javac, java = _which("javac"), _which("java")
    if javac is None or java is None:
        return None
    javac, java = os.path.realpath(javac), os.path.realpath(java)
    home = os.path.dirname(os.path.dirname(javac))
    lang = Language("java", "Main.java", (javac, "-J-Xshare:auto", "{file}"),
                    (java, "-Xss64m", "-XX:+UseSerialGC", "-cp", ".", "{stem}"), "",
                    () if home.startswith("/usr/") else (home,))
    return lang, [javac, "-version"]


ALL_LANGUAGES = ("python", "pytest", "bash", "cpp", "c", "nodejs", "java", "rust", "go")
