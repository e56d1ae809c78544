#!/usr/bin/env python3
"""Apply mutmut mutants one at a time, each in a fork of a warm process (issue 43).

mutmut's own run costs ~10-25 s a mutant for the modules that run in forked children (the
sandbox's init, its session workers, the fork server), and it links a mutant only to the tests
it saw call the function in the test process. This harness runs *every* named test for *every*
mutant: the parent imports pytest and the tests' imports once, then forks one child per mutant
that sets mutmut's ``MUTANT_UNDER_TEST`` and runs ``pytest -x`` over the tests.

usage: scripts/mutants_alone.py COPY NAMES... --tests NODEID... [--jobs N] [--timeout S]
                                [--out FILE] [--resume] [--env K=V ...] [--precollect]
       scripts/mutants_alone.py COPY --list MODULE      (print MODULE's mutant names)

  COPY      a copy kept by `scripts/mutation.py --keep ...` (its mutants/src holds the mutated
            modules). The run changes into COPY, so the tests are COPY's files: copy the
            checkout's current test files in first.
  NAMES     mutant names (arl_tangram.x.y.x_f__mutmut_3), or files of them, one a line
  --tests   pytest node ids, relative to COPY, or files of them, one a line (run in the order
            given: fast, discriminating tests first make a catch quicker); pytest options too,
            e.g. `--deselect` and a node id (one a line in a file)
  --jobs    mutants run at once (default 1)
  --timeout wall clock per mutant, seconds (default 60); past it the child's whole process
            group (and every descendant still found) is killed: outcome "timeout", a catch
  --out     one JSON line per mutant: name, outcome, seconds, pytest's counts
            (default mutants_alone.jsonl); each child's output goes to OUT's ".logs" folder
  --resume  skip the names already in --out (appended to)
  --env     extra environment for the children, e.g. ARL_TANGRAM_OWN_PROCESS=1 (the tests
            marked own_process then run in the child itself, not in a fresh interpreter each:
            the child is already a fresh fork of a process that ran no test)
  --precollect  collect the tests once in the parent (each child skips ~3-4 s of start-up)

Example (sandbox/init, docs/testing.md):
  .venv/bin/python scripts/mutation.py --keep --tests tests/managers/cpu/test_sandbox_init_values.py \
      'arl_tangram.managers.cpu.sandbox.init*'     # stop it once "Running stats" shows
  C=/var/tmp/tangram-mutmut-XXXX; cp tests/managers/cpu/test_sandbox_init_values.py $C/tests/managers/cpu/
  scripts/mutants_alone.py $C --list arl_tangram.managers.cpu.sandbox.init > names.txt
  nice -n 19 scripts/mutants_alone.py $C names.txt --tests tests/managers/cpu/test_sandbox_init_values.py \
      --jobs 2 --timeout 60 --precollect --env ARL_TANGRAM_OWN_PROCESS=1 --out init.jsonl [--resume]

pytest runs with `--tb=line`: a long traceback parses the mutated module (36,000 lines for the
init), seconds per failure.

Outcomes: "caught" (a test failed or errored), "timeout" (caught), "survived" (pytest passed
with as many tests passed as the clean run, run first under a name that does not exist), and
"error" (look by hand): no report from the child itself, or pytest passed with another count of
passed tests. The counts come from a plugin in the child and are written only by the child's
own pid: a mutant that makes a forked test process return into pytest once made a harness that
read the exit status alone record "survived" while pytest printed "1 failed" (docs/testing.md).
As in scripts/mutation.py's copy: ARL_TANGRAM_PURE=1 and PYTHONPATH=COPY/mutants/src, so child
processes (the fork server, whose copy passes MUTANT_UNDER_TEST on) run the mutant too.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

CLEAN = "arl_tangram.__no_such_mutant__"


class _Counts:
    """A pytest plugin: the session's counts, as pytest itself reports them."""

    def __init__(self) -> None:
        self.c = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}

    def pytest_runtest_logreport(self, report):  # type: ignore[no-untyped-def]
        if report.failed:
            self.c["failed" if report.when == "call" else "errors"] += 1
        elif report.skipped:
            self.c["skipped"] += 1
        elif report.when == "call":
            self.c["passed"] += 1

    def pytest_collectreport(self, report):  # type: ignore[no-untyped-def]
        if report.failed:
            self.c["errors"] += 1


def _warm(tests: list[str], precollect: bool) -> None:
    """Import pytest, the conftest files' and the test files' imports; with ``precollect``,
    also collect the tests once (pytest's plugins, the conftest files and the test modules,
    their asserts rewritten, are then in sys.modules: a child's pytest reuses them)."""
    import pytest

    files = {Path(t.split("::")[0]) for t in tests if not t.startswith("-")}
    for f in list(files):
        files |= {p / "conftest.py" for p in f.parents if (p / "conftest.py").is_file()}
    for f in sorted(files):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for m in mods:
                with contextlib.suppress(Exception):  # (a name, not a module; or not importable)
                    importlib.import_module(m)
    if precollect:
        saved = os.dup(1), os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        try:
            rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *tests])
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (null, *saved):
                os.close(fd)
        if rc != 0:
            raise SystemExit(f"collecting the tests failed (pytest exit {rc})")


def _child(name: str, tests: list[str], report: str, log: str) -> None:
    os.setpgid(0, 0)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    me = os.getpid()
    rc = 99
    counts = _Counts()
    try:
        os.environ["MUTANT_UNDER_TEST"] = name
        from mutmut.mutation.trampoline import set_mutant_under_test

        set_mutant_under_test(name)
        import pytest

        rc = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--tb=line", *tests],
                                plugins=[counts]))
    finally:
        if os.getpid() == me:  # (not a forked test process that came back here)
            with open(report + ".part", "w") as f:
                json.dump({"rc": rc, **counts.c}, f)
            os.rename(report + ".part", report)
        sys.stdout.flush()
        os._exit(0 if rc == 0 else 1)


def _kill_tree(pid: int) -> None:
    try:
        import psutil

        kids = psutil.Process(pid).children(recursive=True)
    except Exception:
        kids = []
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    for k in kids:
        with contextlib.suppress(Exception):
            k.kill()


def _outcome(rep: dict | None, clean_passed: int | None) -> str:
    if rep is None:
        return "error"
    if rep["rc"] != 0 or rep["failed"] or rep["errors"]:
        return "caught"
    if clean_passed is not None and rep["passed"] != clean_passed:
        return "error"
    return "survived"


def run(names: list[str], tests: list[str], jobs: int, timeout: float, out: Path,
        clean_passed: int | None = None) -> int | None:
    """Run ``names`` (first the clean run when ``clean_passed`` is None); return the clean
    run's passed count."""
    tmp = Path(tempfile.mkdtemp(prefix="mutants-alone-"))
    logs = out.with_suffix(".logs")
    logs.mkdir(exist_ok=True)
    queue = list(names)
    if clean_passed is None:
        queue.insert(0, CLEAN)
    running: dict[int, tuple[str, float, str]] = {}
    with out.open("a") as sink:
        while queue or running:
            while queue and len(running) < (1 if clean_passed is None else jobs):
                name = queue.pop(0)
                report = str(tmp / f"{len(queue)}-{os.getpid()}.json")
                safe = re.sub(r"[^\w.-]", "_", name)
                pid = os.fork()
                if pid == 0:
                    # (not the JSON lines' fd: a mutant's test once wrote a frame into it)
                    os.close(sink.fileno())
                    _child(name, tests, report, str(logs / f"{safe}.txt"))
                running[pid] = (name, time.monotonic(), report)
            time.sleep(0.05)
            for pid, (name, t0, report) in list(running.items()):
                done = os.waitpid(pid, os.WNOHANG)[0] == pid
                secs = time.monotonic() - t0
                if not done and secs < timeout:
                    continue
                _kill_tree(pid)
                if not done:
                    os.waitpid(pid, 0)
                del running[pid]
                rep = None
                if os.path.exists(report):
                    rep = json.loads(Path(report).read_text())
                    os.unlink(report)
                outcome = "timeout" if not done else _outcome(rep, clean_passed)
                row = {"name": name, "outcome": outcome, "seconds": round(secs, 2),
                       **(rep or {})}
                if name == CLEAN:
                    if outcome != "survived":
                        raise SystemExit(f"the clean run did not pass: {row} (see {logs})")
                    clean_passed = rep["passed"]  # type: ignore[index]
                    print(f"clean run: {row}", flush=True)
                    continue
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                print(json.dumps(row), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return clean_passed


def list_mutants(copy: Path, module: str) -> list[str]:
    src = copy / "mutants" / "src" / (module.replace(".", "/") + ".py")
    found = re.findall(r"^\s*def (x\w+__mutmut_\d+)\(", src.read_text(), flags=re.M)
    return [f"{module}.{n}" for n in found]


def _listed(items: list[str]) -> list[str]:
    out: list[str] = []
    for n in items:
        if os.path.isfile(n) and not n.endswith(".py"):
            out += [x.strip() for x in Path(n).read_text().splitlines() if x.strip()]
        else:
            out.append(n)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("copy", type=Path)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--tests", nargs="+", default=[])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("mutants_alone.jsonl"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--env", nargs="*", default=[])
    ap.add_argument("--precollect", action="store_true")
    ap.add_argument("--list", metavar="MODULE")
    args = ap.parse_args()
    copy = args.copy.resolve()
    if args.list:
        print("\n".join(list_mutants(copy, args.list)))
        return 0
    if not args.tests:
        ap.error("--tests is required")
    names, tests = _listed(args.names), _listed(args.tests)
    out = args.out.resolve()
    if args.resume and out.exists():
        done = {json.loads(line)["name"] for line in out.read_text().splitlines() if line.strip()}
        names = [n for n in names if n not in done]
    src = str(copy / "mutants" / "src")
    os.environ.update({"ARL_TANGRAM_PURE": "1", "PYTHONPATH": src})
    os.environ.update(dict(kv.split("=", 1) for kv in args.env))
    os.environ.pop("MUTANT_UNDER_TEST", None)
    sys.path.insert(0, src)
    sys.path.insert(0, str(copy))  # (pytest's rootdir: the tests' own package, if any)
    os.chdir(copy)
    _warm(tests, args.precollect)
    import arl_tangram

    if not arl_tangram.__file__ or not arl_tangram.__file__.startswith(src):
        raise SystemExit(f"arl_tangram imported from {arl_tangram.__file__}, not {src}")
    print(f"{len(names)} mutants, {len(tests)} tests, jobs {args.jobs}, timeout {args.timeout}",
          flush=True)
    run(names, tests, args.jobs, args.timeout, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
