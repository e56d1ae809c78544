#!/usr/bin/env python3
"""`make mutation-diff`, and `.ci/run`'s check of changed lines: the mutants of the lines a
change touched, against the tests that reach them, in a copy of the committed tree (issue 43
item 3; docs/testing.md section 5).

usage: scripts/mutation_diff.py [--base REV] [--head REV] [--coverage FILE] [--budget S]
                                [--measure-budget S] [--max-mutants N] [--keep]

  --base REV     what the change is measured against. Default: $MUTATION_BASE, else the commit
                 in `.ci/mutation-base` (the commit the session that lands this change started
                 from: a landing is many commits), else HEAD~1, saying so. A base not in this
                 clone (a shallow clone) skips the check, saying so; one that is not an
                 ancestor of HEAD is replaced by their merge base, saying so.
  --coverage FILE  the coverage data of the suite's own run (`make test TEST_COVERAGE=FILE`,
                 as `.ci/run` does), each test's lines under its node id
                 (tests/_coverage_context.py): which tests reach a changed line is read there,
                 with no coverage run of the check's own (see 2.)
  --budget S     hard cap on the mutants' runs in seconds (default 240, $MUTATION_DIFF_BUDGET_S)
  --measure-budget S  hard cap on the check's own coverage runs (default 600,
                 $MUTATION_DIFF_MEASURE_S)
  --max-mutants N  at most this many mutants, the first ones in file and line order (default 40)
  --keep         keep the copy

What it does, in a copy of HEAD (`git archive`: others' work in progress never enters it, and
the core runs as pure Python there, ARL_TANGRAM_PURE=1):

1. the lines HEAD added or changed against the base in src/arl_tangram/**.py (`git diff -U0`),
   each mapped to the statement it belongs to (a continued line to its statement's first line;
   docstrings, comments, blank lines, `def`/`class`/`import` lines are not statements run);
2. which tests reach each changed statement: from --coverage's data where it measured the file
   as HEAD has it; else (no --coverage, a mypyc-compiled core module -- coverage cannot see
   compiled lines --, or a file that differs from HEAD's in the measured tree) from one coverage
   run of the tests of its room (`_ROOMS`: src/arl_tangram/core -> tests/core, ...; of those, the
   files that name the module, e.g. ``jupyter``, where some do), pure Python, in the copy, a
   plugin switching coverage's context per test id. A changed statement no test reaches FAILS
   the check, named with file and line -- except in code that runs only in child processes
   coverage does not follow (the fork server, the sandbox, the reaper: `_CHILD_ONLY`), listed
   as not measured. A line run only at import (module and class bodies) counts as reached by
   its room's tests that name the module;
3. for each reached changed statement, mutants (a comparison's operator flipped, + and -, * and
   /, `and` and `or` swapped, a number + 1, True/False swapped, a `not` dropped, a return value
   None), each run against only the tests that reached its line (its room's first; `pytest -x`,
   a parametrized test whole); a mutant that survives FAILS the check, unless its line says
   `# pragma: no mutate` (mutmut's own marker: a mutant shown equivalent).

Exit 0: nothing to do (no changed Python lines of the package), or every changed statement was
reached and no mutant run survived; 1: a changed statement no test reaches, or a mutant that
survived; 2: bad use. The check never fails for time or load: past a budget what is left is
listed as not run (not measured), and when a room's tests fail unmutated in the copy (a flaky
test under load) their reach still counts but the room's mutants are not run, saying so.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy as _copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv/bin/python").exists() \
    else sys.executable
PKG = "src/arl_tangram/"

# A module's room: the tests that guard it (the first matching prefix wins). The managers'
# rooms: their own tests and the values files of issue 43 (`test_<module>_values.py`, fast).
_ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("src/arl_tangram/managers/cpu/", ("tests/managers/cpu/test_cpu_*.py",
                                       "tests/managers/cpu/test_*_values.py")),
    ("src/arl_tangram/managers/gpu/", ("tests/managers/gpu/test_gpu_*.py",
                                       "tests/managers/gpu/test_*_values.py")),
    ("src/arl_tangram/managers/api/", ("tests/managers/api/test_api_manager.py",)),
    ("src/arl_tangram/managers/", ("tests/managers",)),
    ("src/arl_tangram/core/", ("tests/core",)),
    ("src/arl_tangram/api/", ("tests/api",)),
    ("src/arl_tangram/runtime/", ("tests/runtime",)),
    ("src/arl_tangram/sim/", ("tests/sim",)),
    ("src/arl_tangram/replay/", ("tests/replay",)),
    ("src/arl_tangram/", ("tests",)),
)
# Code that runs only in processes coverage does not follow (the fork server and what it forks).
_CHILD_ONLY = ("src/arl_tangram/managers/cpu/zygote/", "src/arl_tangram/managers/cpu/sandbox/",
               "src/arl_tangram/managers/cpu/reaper/server.py",
               "src/arl_tangram/managers/gpu/_preload.py")
BASE_FILE = ".ci/mutation-base"
PRAGMA = "pragma: no mutate"

# The pytest plugin the coverage run loads (-p): one coverage context per test id.
_PLUGIN = '''
import coverage


def pytest_runtest_setup(item):
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
'''

def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd or ROOT, check=True, capture_output=True,
                          text=True).stdout


def changed_lines(base: str, head: str) -> dict[str, set[int]]:
    """File -> the line numbers (in ``head``) that ``head`` added or changed against ``base``."""
    out: dict[str, set[int]] = {}
    diff = git("diff", "-U0", "--no-renames", "--no-color", base, head, "--", PKG)
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:]
            path = name[2:] if name.startswith("b/") and name.endswith(".py") else None
        elif line.startswith("@@") and path is not None:
            m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
            if m:
                start, n = int(m.group(1)), int(m.group(2) or "1")
                out.setdefault(path, set()).update(range(start, start + n))
    return {p: ls for p, ls in out.items() if ls}


def statements(tree: ast.Module) -> dict[int, int]:
    """Each line that belongs to a simple statement or a compound one's header -> the
    statement's first line (what coverage counts). Docstrings are left out."""
    out: dict[int, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or isinstance(
                node, ast.Import | ast.ImportFrom | ast.Global | ast.Nonlocal):
            continue  # (`global`/`nonlocal` declare: no code runs, coverage never sees them)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # (a def runs at import: every test "reaches" it)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and (isinstance(node.value.value, str) or node.value.value is Ellipsis):
            continue  # a docstring, or a stub's `...` (a Protocol's method: never run)
        body = getattr(node, "body", None)
        end = (body[0].lineno - 1) if isinstance(body, list) and body and \
            isinstance(body[0], ast.stmt) else (node.end_lineno or node.lineno)
        for ln in range(node.lineno, max(node.lineno, end) + 1):
            out.setdefault(ln, node.lineno)
    return out


# ---- mutants -----------------------------------------------------------------------------------

_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
        ast.IsNot: ast.Is}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
        ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv}


@dataclass
class Mutant:
    path: str
    line: int
    what: str
    source: str  # the whole mutated module
    outcome: str = "not run"
    tests: list[str] = field(default_factory=list)


def _variants(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP:
                new = _copy.deepcopy(node)
                new.ops[i] = _CMP[type(op)]()
                yield f"{type(op).__name__} -> {_CMP[type(op)].__name__}", new
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        new = _copy.deepcopy(node)
        new.op = _BIN[type(node.op)]()
        yield f"{type(node.op).__name__} -> {type(new.op).__name__}", new
    elif isinstance(node, ast.BoolOp):
        new = _copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield f"{type(node.op).__name__} -> {type(new.op).__name__}", new
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield f"{node.value} -> {not node.value}", ast.Constant(not node.value)
    elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        yield f"{node.value!r} -> {node.value + 1!r}", ast.Constant(node.value + 1)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "not dropped", _copy.deepcopy(node.operand)
    elif isinstance(node, ast.Return) and node.value is not None \
            and not (isinstance(node.value, ast.Constant) and node.value.value is None):
        yield "return None", ast.Return(value=None)


class _Swap(ast.NodeTransformer):
    def __init__(self, target: ast.AST, new: ast.AST) -> None:
        self.target, self.new, self.done = target, new, False

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not self.done and _key(node) == _key(self.target):
            self.done = True
            return ast.copy_location(self.new, node)
        return super().generic_visit(node)


def _key(node: ast.AST) -> tuple[object, ...]:
    return (type(node), getattr(node, "lineno", None), getattr(node, "col_offset", None),
            getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None))


def mutants_of(path: str, text: str, lines: set[int]) -> list[Mutant]:
    tree = ast.parse(text)
    src_lines = text.splitlines()
    doc = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
           and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    out = []
    for node in ast.walk(tree):
        ln = getattr(node, "lineno", None)
        if ln not in lines or id(node) in doc or PRAGMA in src_lines[ln - 1]:
            continue
        # (a default value or an annotation's constant is data, not logic: kept to its line)
        for what, new in _variants(node):
            t = _copy.deepcopy(tree)
            target = next(n for n in ast.walk(t) if _key(n) == _key(node))
            sw = _Swap(target, new)
            t = sw.visit(t)
            if not sw.done:
                continue
            ast.fix_missing_locations(t)
            out.append(Mutant(path, ln, what, ast.unparse(t)))
    out.sort(key=lambda m: (m.path, m.line, m.what))
    return out


# ---- running -----------------------------------------------------------------------------------

def room_of(path: str) -> tuple[str, ...]:
    for prefix, tests in _ROOMS:
        if path.startswith(prefix):
            return tests
    return ("tests",)


def _expand(work: Path, tests: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for t in tests:
        if "*" in t:
            out += sorted(str(p.relative_to(work)) for p in work.glob(t))
        elif (work / t).exists():
            out.append(t)
    return out


def _mentioning(work: Path, tests: list[str], paths: list[str]) -> list[str]:
    """The test files of a room that name one of ``paths``' modules (its file name, e.g.
    ``jupyter`` for api/jupyter.py, as a word): a room's whole suite can take many minutes; all
    of the room where none names them."""
    stems = {Path(p).stem for p in paths} - {"__init__"}
    if not stems:
        return tests
    word = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(stems)) + r")\b")
    files: list[str] = []
    for t in tests:
        ps = [work / t] if (work / t).is_file() else sorted((work / t).rglob("test_*.py"))
        files += [str(p.relative_to(work)) for p in ps if word.search(p.read_text(errors="replace"))]
    return files or tests


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(work / "src"), ARL_TANGRAM_PURE="1")
    env.pop("TANGRAM_SKIP_LOG", None)
    return env


def _pytest(work: Path, args: list[str], env: dict[str, str], timeout: float,
            pre: list[str] | None = None, show: bool = False) -> int:
    """pytest in the copy; -1 past ``timeout``. Past it, pytest is interrupted (SIGINT: its
    fixtures tear down what they started -- a judge engine runs in a session of its own, which a
    kill of pytest would leave behind), then its process group killed after TEARDOWN_S."""
    # (SIGINT at its default in the child: a shell starts a background job with it ignored,
    # and an ignored signal stays ignored across exec -- the interrupt would then do nothing)
    p = subprocess.Popen([PY, *(pre or []), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *_IGNORE, *args], cwd=work, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         preexec_fn=_default_sigint)
    try:
        out, _ = p.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=TEARDOWN_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return -1
    if show and p.returncode not in (0, 5):
        print("\n".join(out.splitlines()[-15:]), file=sys.stderr)
    return p.returncode


TEARDOWN_S = 60.0  # how long an interrupted pytest may take to tear down


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Tests of the build, not of behaviour: the copy has no compiled core (it runs pure Python).
_IGNORED = ("tests/core/test_native.py",)
_IGNORE = tuple(f"--ignore={t}" for t in _IGNORED)


def room_tests(work: Path, room: tuple[str, ...], paths: list[str]) -> list[str]:
    """The test files of ``room`` that name ``paths``' modules (all of it where none does), less
    the tests of the build (`_IGNORED`: a file named on pytest's command line is collected,
    --ignore or not)."""
    return [t for t in _mentioning(work, _expand(work, room), paths) if not t.startswith(_IGNORED)]


def resolve_base(arg: str | None, root: Path | None = None) -> tuple[str, str]:
    """The base to diff against and where it came from: ``arg`` (--base or $MUTATION_BASE),
    else the commit `.ci/mutation-base` names (its first line that is not blank or a comment),
    else HEAD~1."""
    if arg:
        return arg, "given"
    f = (root or ROOT) / BASE_FILE
    if f.is_file():
        for line in f.read_text().splitlines():
            word = line.split("#", 1)[0].strip()
            if word:
                return word, BASE_FILE
    return "HEAD~1", f"no {BASE_FILE}: HEAD~1, the last commit alone"


def _stem_tests(nodeids: set[str], room: list[str]) -> list[str]:
    """Node ids -> the tests to run: a parametrized test whole (its ids can hold anything), the
    room's files first."""
    ids = {n.split("[", 1)[0] for n in nodeids if n}
    inroom = tuple(room)
    return sorted(ids, key=lambda n: (not n.startswith(inroom), n))


def suite_reach(cov_path: str, todo: dict[str, set[int]],
                head_text: dict[str, str]) -> dict[str, dict[int, set[str]]]:
    """From the suite's coverage data: file -> line -> the node ids that ran it (the empty
    context, import time, as ""), for the files it measured as HEAD has them, and nothing for
    a plain one it never imported."""
    import coverage

    data = coverage.CoverageData(basename=cov_path)
    data.read()
    by_rel: dict[str, str] = {}
    for f in data.measured_files():
        k = f.rfind("/" + PKG)
        if k >= 0:
            by_rel[f[k + 1:]] = f
    out: dict[str, dict[int, set[str]]] = {}
    written = Path(cov_path).stat().st_mtime
    for p in todo:
        f = by_rel.get(p)
        if f is None:
            # not imported by any test: nothing of it reached -- unless it is compiled (then
            # coverage could not see it), the checkout has it other than HEAD, or it is newer
            # than the data (data of an older tree: CI writes it on the same clone just before)
            try:
                mine = ROOT / p
                if not _compiled(p) and mine.read_text() == head_text[p] \
                        and mine.stat().st_mtime <= written:
                    out[p] = {}
            except OSError:
                pass
            continue
        try:
            same = Path(f).read_text() == head_text[p]
        except OSError:
            same = False
        if same:
            out[p] = {ln: set(cs) for ln, cs in data.contexts_by_lineno(f).items()}
    return out


def _compiled(path: str) -> bool:
    """A core module mypyc compiled in this checkout (coverage sees none of its lines)."""
    import importlib.machinery

    f = ROOT / path
    return path.startswith(PKG + "core/") and any(
        f.with_name(f.stem + sfx).exists() for sfx in importlib.machinery.EXTENSION_SUFFIXES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=os.environ.get("MUTATION_BASE") or None)
    ap.add_argument("--coverage", default=None, metavar="FILE")
    ap.add_argument("--budget", type=float,
                    default=float(os.environ.get("MUTATION_DIFF_BUDGET_S") or 240))
    ap.add_argument("--measure-budget", type=float,
                    default=float(os.environ.get("MUTATION_DIFF_MEASURE_S") or 600))
    ap.add_argument("--max-mutants", type=int, default=40)
    ap.add_argument("--head", default="HEAD", help="the change's last commit (default HEAD)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    if a.coverage is not None and not Path(a.coverage).is_file():
        print(f"mutation-diff: --coverage {a.coverage}: no such file (was the suite run with "
              "`make test TEST_COVERAGE=FILE`?)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    rev, why = resolve_base(a.base)
    try:
        head = git("rev-parse", "--verify", a.head + "^{commit}").strip()
    except subprocess.CalledProcessError:
        print(f"mutation-diff: --head {a.head!r} is not a commit here", file=sys.stderr)
        return 2
    try:
        base = git("rev-parse", "--verify", rev + "^{commit}").strip()
    except subprocess.CalledProcessError:
        print(f"mutation-diff: base {rev!r} ({why}) is not in this clone (a shallow clone, or "
              "a first commit): skipped")
        return 0
    if why != "given":
        print(f"mutation-diff: base {base[:10]} ({why})")
    if subprocess.run(["git", "merge-base", "--is-ancestor", base, head], cwd=ROOT).returncode:
        mb = git("merge-base", base, head).strip()
        print(f"mutation-diff: base {base[:10]} is not an ancestor of {head[:10]}: "
              f"their merge base {mb[:10]} instead")
        base = mb
    changed = changed_lines(base, head)
    todo: dict[str, set[int]] = {}
    head_text: dict[str, str] = {}
    for path, lines in sorted(changed.items()):
        text = git("show", f"{head}:{path}")
        stmts = statements(ast.parse(text))
        src_lines = text.splitlines()
        s = {stmts[ln] for ln in lines if ln in stmts and PRAGMA not in src_lines[ln - 1]}
        if s:
            todo[path] = s
            head_text[path] = text
    print(f"mutation-diff: {base[:10]}..{head[:10]}: "
          f"{sum(len(v) for v in todo.values())} changed statements in {len(todo)} files")
    if not todo:
        print("mutation-diff: no changed statements of the package: nothing to check")
        return 0
    suite = suite_reach(a.coverage, todo, head_text) if a.coverage else {}
    base_dir = os.environ.get("TMPDIR") or ("/var/tmp" if os.path.isdir("/var/tmp") else None)
    work = Path(tempfile.mkdtemp(prefix="tangram-mutdiff-", dir=base_dir))
    try:
        arch = subprocess.run(["git", "archive", head], cwd=ROOT, check=True,
                              capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=arch, check=True)
        return _run(work, todo, suite, a, t0)
    finally:
        if a.keep:
            print(f"mutation-diff: the copy is kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, paths: list[str], tests: list[str], env: dict[str, str],
             deadline: float) -> tuple[dict[str, dict[int, set[str]]] | None, int]:
    """One coverage run of ``tests`` in the copy, pure Python, a context per test: file -> line
    -> node ids ("" for import time), and pytest's exit status (-1: past the deadline)."""
    (work / "_mutation_diff_plugin.py").write_text(_PLUGIN)
    cov_file = work / ".coverage.mutation-diff"
    cov_file.unlink(missing_ok=True)
    files = [str(work / p) for p in paths]
    cenv = dict(env, PYTHONPATH=os.pathsep.join([str(work), str(work / "src")]))
    # (under `coverage run`, so that what runs at import -- module and class bodies -- is
    # seen too, with the empty context)
    rc = _pytest(work, ["-p", "_mutation_diff_plugin", *tests], cenv,
                 deadline - time.monotonic(),
                 pre=["-m", "coverage", "run", f"--data-file={cov_file}",
                      f"--include={','.join(files)}"], show=True)
    if rc == -1 or not cov_file.exists():
        return None, rc
    import coverage

    data = coverage.CoverageData(basename=str(cov_file))
    data.read()
    out = {p: {ln: set(cs) for ln, cs in data.contexts_by_lineno(str(work / p)).items()}
           for p in paths}
    cov_file.unlink(missing_ok=True)
    return out, rc


def _run(work: Path, todo: dict[str, set[int]], suite: dict[str, dict[int, set[str]]],
         a: argparse.Namespace, t0: float) -> int:
    env = _env(work)
    measure_deadline = time.monotonic() + a.measure_budget
    by_file: dict[str, list[str]] = {}  # file -> its room's tests that name it
    reach: dict[str, dict[int, set[str]]] = {}
    flaky: set[str] = set()  # files whose room's tests failed unmutated in the copy
    not_measured: list[str] = []
    own: dict[tuple[str, ...], list[str]] = {}
    for path in todo:
        by_file[path] = room_tests(work, room_of(path), [path])
        if path in suite:
            reach[path] = suite[path]
        else:
            own.setdefault(room_of(path), []).append(path)
    if suite:
        print(f"mutation-diff: reach of {len(suite)} files from the suite's coverage data")
    # the compiled core first: nothing else can measure it (a file that differs from HEAD in the
    # measured tree -- a dirty checkout, never CI's clone -- comes after, within what is left)
    for room, paths in sorted(own.items(), key=lambda kv: not all(map(_compiled, kv[1]))):
        why = "compiled core, measured pure" if all(map(_compiled, paths)) else "measured here"
        tests = room_tests(work, room, paths)
        t1 = time.monotonic()
        got, rc = _measure(work, paths, tests, env, measure_deadline)
        print(f"mutation-diff: {len(paths)} files ({why}) by {len(tests)} test paths of "
              f"{' '.join(room)}: {time.monotonic() - t1:.0f} s, rc {rc}")
        if got is None:
            print(f"mutation-diff: the tests of {' '.join(room)} ran past --measure-budget "
                  f"({a.measure_budget:.0f} s): {', '.join(paths)} not measured (not failed)")
            not_measured += [f"{p}:{ln}" for p in paths for ln in sorted(todo[p])]
            continue
        if rc not in (0, 5):
            print(f"mutation-diff: the tests of {' '.join(room)} fail unmutated in the copy "
                  f"(rc {rc}): their reach counts, their mutants are not run")
            flaky.update(paths)
        reach.update(got)
    unreached: list[str] = []
    for p in sorted(todo):
        if p not in reach:
            continue
        by_line = reach[p]
        for ln in sorted(todo[p]):
            if by_line.get(ln):
                continue
            (not_measured if p.startswith(_CHILD_ONLY) else unreached).append(f"{p}:{ln}")
    for where in not_measured:
        print(f"  not measured: {where}")
    for where in unreached:
        print(f"  UNREACHED: {where}: no test runs this changed line")
    mutants: list[Mutant] = []
    for path, lines in sorted(todo.items()):
        if path not in reach or path in flaky:
            continue
        text = (work / path).read_text()
        for m in mutants_of(path, text, lines):
            ids = reach[path].get(m.line) or set()
            if not ids:
                continue
            # a line run only at import: its room's tests that name the module
            tests = _stem_tests(ids, by_file[path]) if ids - {""} else by_file[path]
            m.tests = [t for t in tests if not t.startswith(_IGNORED)]
            mutants.append(m)
    shown = mutants[:a.max_mutants]
    deadline = time.monotonic() + a.budget
    for m in shown:
        left = deadline - time.monotonic()
        if left < 5:
            break
        if not m.tests:
            continue  # (not run: no test to run it against)
        mod = work / m.path
        orig = mod.read_text()
        mod.write_text(m.source)
        try:
            rc = _pytest(work, ["-x", *m.tests], env, left)
        finally:
            mod.write_text(orig)
        # 1: a test failed; 2: collection failed (the mutant does not import). 0 alone is a
        # survivor; 3-5 (pytest's own errors, nothing collected) and -1 (the budget) are not run.
        m.outcome = "caught" if rc in (1, 2) else ("survived" if rc == 0 else "not run")
    survived = [m for m in shown if m.outcome == "survived"]
    counts = {k: sum(1 for m in shown if m.outcome == k) for k in ("caught", "survived", "not run")}
    counts["not run"] += len(mutants) - len(shown)
    for m in survived:
        print(f"  SURVIVED: {m.path}:{m.line}: {m.what} (tests: {len(m.tests)}); kill it with a "
              f"test, or mark the line '# {PRAGMA}' if it is equivalent")
    print(f"mutation-diff: {json.dumps(counts)} in {time.monotonic() - t0:.0f} s")
    return 1 if unreached or survived else 0


if __name__ == "__main__":
    sys.exit(main())
