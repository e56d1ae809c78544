#!/usr/bin/env python3
"""`make mutation`: mutmut over the modules of pyproject's [tool.mutmut], in a copy of the
committed tree (HEAD), and the score per module (issue 27; docs/testing.md).

usage: scripts/mutation.py [--tests PATH ...] [--timeout-multiplier X] [--timeout-constant S]
                           [--max-children N] [--keep] [MUTANT_GLOB ...]

  MUTANT_GLOB   mutmut's names, e.g. 'arl_tangram.api.middleware*' (default: every module); a
                name given after --tests (it starts with `arl_tangram.`) is taken as a glob
  --tests       run these test files instead of the configured selection (a quicker run of a
                few modules; written into the copy's pyproject only)
  --timeout-multiplier  mutmut's CPU-time limit per mutant is (tests' time + 1 s) x 2 x this
                and its wall-clock limit (tests' time + 1 s) x this (mutmut's default 15: a
                mutant that loops costs minutes)
  --timeout-constant S  the "+ 1 s" above (mutmut's timeout_constant). The tests' time leaves
                out fixture set-up (a CPU manager's start, models built per module): give tests
                with such fixtures 10 or more, or set-up past the wall-clock limit on a loaded
                machine reads as a "timeout", i.e. caught
  --max-children N  mutmut's parallel workers (its default: one per CPU); 1 on a shared machine
  --every-test GLOB ...  run the mutants matching these globs against every selected test, not
                only the tests mutmut saw call their function: mutmut records calls in the test
                process only, and the fork server (which builds the syscall filter) and the
                sandbox are child processes that run the mutant unseen (they inherit mutmut's
                MUTANT_UNDER_TEST and our PYTHONPATH)
  --keep        keep the copy (then `cd` there and `mutmut show NAME` / `mutmut browse`)

The copy keeps others' work in progress and mutmut's `mutants/` out of the checkout. The core
runs as pure Python (ARL_TANGRAM_PURE=1: a mutated core module must be the one that runs) and
child processes (the sandbox fork server, `tangram serve`) see the mutated sources through
PYTHONPATH; the fork server, whose environment is scrubbed, also gets mutmut's MUTANT_UNDER_TEST
(a wrapper appended to the copy's client.py), or it would run the original code, and mutmut's
workers keep RLIMIT_CPU's hard limit unlimited (`_MUTMUT`: else no sandbox could start). A mutant
is caught when its tests fail, hang past mutmut's timeout or die (a worker
past MUTATION_MAX_RSS_MB, 3072 by default, is killed); score = caught / (caught + survived + no
tests): a mutant no test runs counts against the score.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"


def _copy(commit: str) -> Path:
    # (TMPDIR, else /var/tmp, not /tmp: a sandbox replaces /tmp with its own, and a test that
    # binds the package's directory into a sandbox at its own path, test_isolation_probe.py,
    # needs it elsewhere)
    base = os.environ.get("TMPDIR") or ("/var/tmp" if os.path.isdir("/var/tmp") else None)
    work = Path(tempfile.mkdtemp(prefix="tangram-mutmut-", dir=base))
    arch = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True,
                          capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=arch, check=True)
    for so in (ROOT / "src/arl_tangram/managers/cpu").rglob("_fastpath*.so"):  # built, untracked
        dst = work / so.relative_to(ROOT)
        if dst.parent.is_dir():
            shutil.copy2(so, dst)
    return work


# Put into the copy's `zygote_env` (host/reaper.py): the fork server gets a scrubbed environment,
# without mutmut's MUTANT_UNDER_TEST, so it (and every sandbox, its fork) would run the original
# code: the syscall filter it builds and installs would never be a mutant.
_ZYGOTE_ENV_DEF = "def zygote_env() -> dict[str, str]:"
_ZYGOTE_ENV_PATCH = """
    if "MUTANT_UNDER_TEST" in os.environ:  # (scripts/mutation.py, in its copy only)
        env["MUTANT_UNDER_TEST"] = os.environ["MUTANT_UNDER_TEST"]
    return env
"""


# Appended to the copy's zygote/__init__.py (imported first by `python -m ...zygote.server`): the
# fork server then clears its environment (`_forget_start` empties posix.environ, which is also
# os.environ's store), so mutmut's trampolines must get the mutant's name process-locally.
_ZYGOTE_PIN_PATCH = """

import os as _mutation_os  # (scripts/mutation.py, in its copy only)

if "__mutmut_" in _mutation_os.environ.get("MUTANT_UNDER_TEST", ""):  # (a mutant, not "stats")
    from mutmut.mutation.trampoline import set_mutant_under_test as _mutation_set

    _mutation_set(_mutation_os.environ["MUTANT_UNDER_TEST"])
"""


def _pass_mutant_to_fork_server(copy: Path) -> None:
    p = copy / "src/arl_tangram/managers/cpu/host/reaper.py"
    text = p.read_text()
    at = text.find(_ZYGOTE_ENV_DEF)
    end = text.find("\n    return env\n", at)
    if at < 0 or end < 0 or "\nimport os\n" not in text:
        raise SystemExit(f"{p}: no zygote_env to patch (the fork server would not run mutants)")
    p.write_text(text[:end] + "\n" + _ZYGOTE_ENV_PATCH.strip("\n") + "\n"
                 + text[end + len("\n    return env\n"):])
    z = copy / "src/arl_tangram/managers/cpu/zygote/__init__.py"
    z.write_text(z.read_text() + _ZYGOTE_PIN_PATCH)
    for module in SERVERS:
        _server_as_its_module(copy / "src" / (module.replace(".", "/") + ".py"), module)


_SERVER_NAME_PATCH = """
import sys as _mutation_sys  # (scripts/mutation.py, in its copy only)

_RUN_AS_MAIN = __name__ == "__main__"
if _RUN_AS_MAIN:  # `python -m {module}`: its functions' __module__ would be __main__
    __name__ = "{module}"
    _mutation_sys.modules[__name__] = _mutation_sys.modules["__main__"]
"""

# the servers the CPU manager starts as `python -m MODULE` (their functions then live in __main__)
SERVERS = ("arl_tangram.managers.cpu.zygote.server", "arl_tangram.managers.cpu.reaper.server")


def _server_as_its_module(p: Path, module: str) -> None:
    """A server run as `python -m MODULE` (the fork server, the reaper) defines its functions
    in `__main__`; mutmut's trampolines compare a function's module with the mutant's name and
    so always ran the original there: every mutant of the server's own code "survived" unrun
    (helper-62, issue 43). In the copy the module takes its own name before any function is
    defined, and its entry point is kept."""
    text = p.read_text()
    head, main = "from __future__ import annotations\n", 'if __name__ == "__main__":\n'
    if text.count(head) != 1 or text.count(main) != 1:
        raise SystemExit(f"{p}: no __future__ import or entry point to patch (its mutants would not run)")
    patch = _SERVER_NAME_PATCH.format(module=module)
    text = text.replace(head, head + patch, 1).replace(main, "if _RUN_AS_MAIN:\n", 1)
    p.write_text(text)


def _select_tests(copy: Path, tests: list[str]) -> None:
    p = copy / "pyproject.toml"
    text = p.read_text()
    new = "pytest_add_cli_args_test_selection = [\n" + "".join(f'    "{t}",\n' for t in tests) + "]\n"
    text, n = re.subn(r"pytest_add_cli_args_test_selection = \[\n(?:.*\n)*?\]\n", new, text)
    if n != 1:
        raise SystemExit("pyproject.toml: no pytest_add_cli_args_test_selection to replace")
    p.write_text(text)


def _set_timeout(copy: Path, multiplier: float | None, constant: float | None) -> None:
    p = copy / "pyproject.toml"
    text = p.read_text()
    keys = "".join(f"{k} = {v}\n" for k, v in (("timeout_multiplier", multiplier),
                                               ("timeout_constant", constant)) if v is not None)
    text, n = re.subn(r"^\[tool\.mutmut\]\n", f"[tool.mutmut]\n{keys}", text, flags=re.M)
    if n != 1:
        raise SystemExit("pyproject.toml: no [tool.mutmut]")
    p.write_text(text)


# mutmut's outcomes -> ours: a mutant is caught when its tests did not pass (failed, hung past
# mutmut's timeout, or died: a mutant that eats all memory is killed by the RSS guard)
_KIND = {"killed": "caught", "timeout": "caught", "segfault": "caught",
         "caught by type check": "caught", "survived": "survived", "suspicious": "survived",
         "no tests": "no tests"}
MAX_RSS = int(os.environ.get("MUTATION_MAX_RSS_MB", "3072")) << 20


def _rss_guard(parent: int, stop: threading.Event) -> None:
    """Kill a mutant worker (a child of mutmut) past MAX_RSS: an endless loop that allocates
    would take the machine's memory before mutmut's timeout ends it."""
    import psutil

    while not stop.wait(1.0):
        try:
            kids = psutil.Process(parent).children()
        except psutil.NoSuchProcess:
            return
        for k in kids:
            try:
                if k.memory_info().rss > MAX_RSS:
                    print(f"mutation: killing {k.pid} ({' '.join(k.cmdline())[:80]}): RSS over "
                          f"{MAX_RSS >> 20} MB", flush=True)
                    k.kill()
            except psutil.NoSuchProcess:
                continue


def _module(name: str) -> str:
    # arl_tangram.api.middleware.x_is_loopback__mutmut_3 -> arl_tangram.api.middleware
    head = name.split("__mutmut_")[0]
    return head.rsplit(".", 1)[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", nargs="*", default=None)
    ap.add_argument("--timeout-multiplier", type=float, default=None)
    ap.add_argument("--max-children", type=int, default=None)
    ap.add_argument("--timeout-constant", type=float, default=None)
    ap.add_argument("--every-test", nargs="*", default=[])
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("globs", nargs="*")
    args = ap.parse_args()
    if args.tests:  # (`--tests a.py b.py 'arl_tangram.x*'`: the glob is not a test file)
        args.globs += [t for t in args.tests if t.startswith("arl_tangram.")]
        args.tests = [t for t in args.tests if not t.startswith("arl_tangram.")]
    if args.every_test:
        args.globs += [g for g in args.every_test if g not in args.globs]
    commit = _head()  # (others commit meanwhile: the run is of this commit, printed)
    copy = _copy(commit)
    _pass_mutant_to_fork_server(copy)
    print(f"mutation: commit {commit}", flush=True)
    if args.tests:
        _select_tests(copy, args.tests)
    if args.timeout_multiplier is not None or args.timeout_constant is not None:
        _set_timeout(copy, args.timeout_multiplier, args.timeout_constant)
    # (made now: a PYTHONPATH entry missing at start-up may be cached as "nothing here")
    (copy / "mutants" / "src").mkdir(parents=True)
    env = {**os.environ, "ARL_TANGRAM_PURE": "1", "PYTHONPATH": str(copy / "mutants" / "src")}
    env.pop("TANGRAM_SKIP_LOG", None)
    print(f"mutation: mutmut in {copy}", flush=True)
    if args.every_test:  # mutants and stats first (no mutant is named so), then the mapping
        _mutmut_run(copy, env, ["__no_mutant__"], args.max_children)
        _every_test(copy, env, args.every_test)
    rc = _mutmut_run(copy, env, args.globs, args.max_children)
    results = _results(copy, env)
    by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    survivors: dict[str, list[str]] = collections.defaultdict(list)
    for name, status in results.items():
        mod = _module(name)
        if args.globs and not any(_match(name, g) for g in args.globs):
            continue
        by[mod][_KIND.get(status, status)] += 1
        if _KIND.get(status) in ("survived", "no tests"):
            survivors[mod].append(f"{name}: {status}")
    print("\nmodule                                   caught survived no-tests unrun  score")
    for mod in sorted(by):
        c = by[mod]
        judged = c["caught"] + c["survived"] + c["no tests"]
        score = c["caught"] / judged if judged else 0.0
        unrun = sum(v for k, v in c.items() if k not in ("caught", "survived", "no tests"))
        print(f"{mod:40} {c['caught']:6} {c['survived']:8} {c['no tests']:8} {unrun:5}"
              f"  {score:6.1%}")
    for mod in sorted(survivors):
        print(f"\n{mod}: not killed")
        for s in survivors[mod]:
            print(f"  {s}")
    if args.keep:
        print(f"\nkept: {copy}  (cd there; {BIN}/mutmut show NAME)")
    else:
        shutil.rmtree(copy, ignore_errors=True)
    return rc


# mutmut, with one change: its worker limits its CPU time with RLIMIT_CPU's soft limit only. It
# sets soft and *hard* ((tests' time + timeout_constant) x 2 x multiplier: a few seconds for a
# quick test), the fork server and every sandbox inherit that hard limit, and a sandbox child may
# not raise its soft limit to the job's `cpu_s` (10 s for the start-up probe, timeouts x cores + 1
# for an action) above it, nor can the fork server lift it (no CAP_SYS_RESOURCE in a container):
# "sandbox: cannot start", every sandbox test failed and every mutant read as caught. SIGXCPU at
# the soft limit still ends a looping worker (and mutmut's wall-clock timer sends it too).
_MUTMUT = """
import os, resource, sys
import mutmut.workers.isolation as iso
from mutmut.__main__ import cli

class _Resource:
    def __getattr__(self, name):
        return getattr(resource, name)

    @staticmethod
    def setrlimit(which, limits):
        if which == resource.RLIMIT_CPU:
            limits = (limits[0], resource.getrlimit(which)[1])
        resource.setrlimit(which, limits)

iso.resource = _Resource()


def _forget_forkserver():
    # a worker forked from mutmut's runner inherits the runner's multiprocessing fork server
    # (started by its first test run: the GPU manager's model processes), which is not the
    # worker's child: `ensure_running`'s waitpid raised ChildProcessError and every test that
    # starts a model process failed at once, a false kill for every mutant it reached. The
    # worker starts a fork server of its own instead.
    import multiprocessing.forkserver as fs

    s = fs._forkserver
    fd = s._forkserver_alive_fd
    s._forkserver_pid = s._forkserver_address = s._forkserver_alive_fd = None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget_forkserver)
sys.argv[0] = "mutmut"
sys.exit(cli())
"""


def _mutmut_run(copy: Path, env: dict[str, str], names: list[str],
                max_children: int | None = None) -> int:
    workers = [] if max_children is None else ["--max-children", str(max_children)]
    proc = subprocess.Popen([str(BIN / "python"), "-c", _MUTMUT, "run", *workers, *names], cwd=copy,
                            env=env)
    stop = threading.Event()
    guard = threading.Thread(target=_rss_guard, args=(proc.pid, stop), daemon=True)
    guard.start()
    try:
        return proc.wait()
    finally:
        stop.set()


def _results(copy: Path, env: dict[str, str]) -> dict[str, str]:
    res = subprocess.run([str(BIN / "mutmut"), "results", "--all", "true"], cwd=copy, env=env,
                         capture_output=True, text=True, check=True)
    out = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^\s*([\w.\u01c1]+__mutmut_\d+): (.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _every_test(copy: Path, env: dict[str, str], globs: list[str]) -> None:
    """Map every function with a mutant matching ``globs`` to every selected test, in the
    stats mutmut saved (it reuses them on the next run of the same configuration)."""
    import json

    path = copy / "mutants" / "mutmut-stats.json"
    stats = json.loads(path.read_text())
    every = sorted(stats["duration_by_test"])
    funcs = {n.partition("__mutmut_")[0] for n in _results(copy, env)
             if any(_match(n, g) for g in globs)}
    for f in funcs:
        stats["tests_by_mangled_function_name"][f] = every
    path.write_text(json.dumps(stats))
    print(f"mutation: {len(funcs)} functions run against all {len(every)} selected tests",
          flush=True)


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def _match(name: str, glob: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, glob)


if __name__ == "__main__":
    sys.exit(main())
