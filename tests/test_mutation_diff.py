"""scripts/mutation_diff.py's parts that decide what is checked (issue 43 item 3): which changed
lines are statements, which mutants a line gets, and which tests are a module's room."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_diff", ROOT / "scripts/mutation_diff.py")
assert _spec is not None and _spec.loader is not None
md = importlib.util.module_from_spec(_spec)
sys.modules["mutation_diff"] = md
_spec.loader.exec_module(md)

SRC = '''"""Doc."""
import os


def f(a, b):
    """Its doc."""
    # a comment
    if a < b and not os.sep:
        return a + 1
    x = (a *
         b)
    return x  # pragma: no mutate
'''


def test_statements_are_the_lines_that_run() -> None:
    st = md.statements(ast.parse(SRC))
    # the if's header (8), the return (9), the two lines of the assignment (10-11 -> 10), the
    # last return (12); not the docstrings, the import, the def, the comment
    assert st == {8: 8, 9: 9, 10: 10, 11: 10, 12: 12}


def test_a_declaration_is_not_a_statement_run() -> None:
    """`nonlocal` and `global` compile to nothing: coverage never reports them run (seen on this
    session's diff: sim/tenants.py's `nonlocal seq` read as unreached)."""
    src = "def f():\n    n = 0\n\n    def g():\n        nonlocal n\n        global X\n" \
          "        n += 1\n\n    return g\n"
    assert md.statements(ast.parse(src)) == {2: 2, 7: 7, 9: 9}


def test_a_stubs_ellipsis_is_not_a_statement_run() -> None:
    """A Protocol method's body `...` never runs (the class is a type, not a base): read as a
    statement it made every new method of a seam an unreached line (managers/base.py)."""
    src = "class P(Protocol):\n    def f(self) -> int: ...\n\n    def g(self) -> int:\n" \
          "        \"\"\"Doc.\"\"\"\n        ...\n\nx = ...\n"
    assert md.statements(ast.parse(src)) == {8: 8}  # (an assignment of `...` does run)


def test_the_mutants_of_a_line() -> None:
    got = {(m.line, m.what) for m in md.mutants_of("x.py", SRC, {8, 9, 10, 12})}
    assert got == {(8, "Lt -> LtE"), (8, "And -> Or"), (8, "not dropped"),
                   (9, "Add -> Sub"), (9, "1 -> 2"), (9, "return None"),
                   (10, "Mult -> Div")}  # (12 says `pragma: no mutate`)
    for m in md.mutants_of("x.py", SRC, {9}):
        compile(m.source, "x.py", "exec")  # each mutant is a module that compiles


def test_a_modules_room() -> None:
    assert md.room_of("src/arl_tangram/core/elastic.py") == ("tests/core",)
    assert md.room_of("src/arl_tangram/managers/cpu/host/cgroups.py") == \
        ("tests/managers/cpu/test_cpu_*.py", "tests/managers/cpu/test_*_values.py")
    assert md.room_of("src/arl_tangram/managers/gpu/worker.py") == \
        ("tests/managers/gpu/test_gpu_*.py", "tests/managers/gpu/test_*_values.py")
    assert md.room_of("src/arl_tangram/specfile.py") == ("tests",)
    files = md._mentioning(ROOT, ["tests/api"], ["src/arl_tangram/api/jupyter.py"])
    assert "tests/api/test_jupyter_translate.py" in files


# ---- the base of a change, and the check end to end (issue 43: wired into .ci/run) --------------


def test_the_base_of_a_change(tmp_path: Path) -> None:
    assert md.resolve_base("abc123", tmp_path) == ("abc123", "given")
    assert md.resolve_base(None, tmp_path) == (
        "HEAD~1", "no .ci/mutation-base: HEAD~1, the last commit alone")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci/mutation-base").write_text("# a comment\n\n  0123abcd  # the start\n")
    assert md.resolve_base(None, tmp_path) == ("0123abcd", ".ci/mutation-base")
    assert md.resolve_base("HEAD~2", tmp_path) == ("HEAD~2", "given")
    # the committed file names one full commit
    rev, why = md.resolve_base(None, ROOT)
    assert why == ".ci/mutation-base" and len(rev) == 40 and int(rev, 16) >= 0


def test_the_tests_a_mutant_runs() -> None:
    ids = {"tests/api/test_a.py::test_x[1-2]", "tests/api/test_a.py::test_x[3]", "",
           "tests/core/test_b.py::test_y", "tests/api/test_c.py::T::test_z"}
    assert md._stem_tests(ids, ["tests/core/test_b.py"]) == [
        "tests/core/test_b.py::test_y", "tests/api/test_a.py::test_x",
        "tests/api/test_c.py::T::test_z"]


_BASE_MOD = "def f(x):\n    return x\n"
_HEAD_MOD = '''LIMIT = 4


def f(x):
    return x


def g(x):
    """A new function; its first branch is reached by no test."""
    if x is None:
        return -1
    return x + LIMIT
'''
_TEST = '''from arl_tangram.mod import f, g


def test_f():
    assert f(3) == 3


def test_g():
    assert g(1) == 5
'''


def _repo(tmp_path: Path) -> tuple[Path, str]:
    import subprocess

    repo = tmp_path / "repo"
    (repo / "src/arl_tangram").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src/arl_tangram/__init__.py").write_text("")
    (repo / "src/arl_tangram/mod.py").write_text(_BASE_MOD)
    (repo / "tests/test_mod.py").write_text("from arl_tangram.mod import f\n\n\ndef test_f():\n"
                                            "    assert f(3) == 3\n")
    # the suite's own plugin, as the copy's conftest: the contexts .ci/run's data carries
    (repo / "tests/conftest.py").write_text((ROOT / "tests/_coverage_context.py").read_text())

    def git(*a: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "base")
    base = git("rev-parse", "HEAD")
    (repo / "src/arl_tangram/mod.py").write_text(_HEAD_MOD)
    (repo / "src/arl_tangram/other.py").write_text("def h():\n    return 2\n")  # no test imports it
    (repo / "tests/test_mod.py").write_text(_TEST)
    git("add", ".")
    git("commit", "-qm", "g")
    return repo, base


def test_a_changed_line_no_test_reaches_fails_the_check(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    repo, base = _repo(tmp_path)
    monkeypatch.setattr(md, "ROOT", repo)
    monkeypatch.delenv("MUTATION_BASE", raising=False)
    # (pytest without the suite's plugins -- schemathesis, hypothesis, ...: the toy needs none)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    # the suite's run under coverage, as `make test TEST_COVERAGE=FILE` makes it
    cov = tmp_path / "coverage"
    subprocess.run([md.PY, "-m", "coverage", "run", f"--data-file={cov}", "-m", "pytest", "-q",
                    "-p", "no:cacheprovider", "tests"], cwd=repo, check=True, capture_output=True,
                   env={**md.os.environ, "PYTHONPATH": str(repo / "src")})
    (repo / ".ci").mkdir()
    (repo / ".ci/mutation-base").write_text(base + "\n")  # (untracked: read from the checkout)
    rc = md.main(["--coverage", str(cov), "--budget", "120"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"base {base[:10]} (.ci/mutation-base)" in out
    # LIMIT = 4, the if, both returns; other.py's return
    assert "5 changed statements in 2 files" in out
    assert "reach of 2 files from the suite's coverage data" in out  # (no run of its own)
    assert "UNREACHED: src/arl_tangram/mod.py:11: no test runs this changed line" in out
    assert "UNREACHED: src/arl_tangram/other.py:2: no test runs this changed line" in out
    assert out.count("UNREACHED") == 2
    # LIMIT's 4 -> 5 (import time: the tests naming the module), `is` -> `is not`, + -> -,
    # the return's value None: each caught by test_g
    assert '{"caught": 4, "survived": 0, "not run": 0}' in out

    # the same change with the branch tested passes; a base not in the clone skips
    (repo / "tests/test_mod.py").write_text(_TEST + "\n\ndef test_g_none():\n"
                                            "    assert g(None) == -1\n")
    (repo / "src/arl_tangram/other.py").unlink()
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "t"],
                   cwd=repo, check=True)
    rc = md.main(["--base", base, "--budget", "120"])  # (no data: the check measures itself)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "UNREACHED" not in out and '"survived": 0' in out
    (repo / ".ci/mutation-base").write_text("f" * 40 + "\n")
    assert md.main([]) == 0
    assert "is not in this clone (a shallow clone, or a first commit): skipped" in \
        capsys.readouterr().out


def test_the_tests_of_the_build_are_never_run_in_the_copy() -> None:
    """The copy has no compiled core: tests/core/test_native.py fails there unmutated, which
    would leave the room's mutants unrun (seen on this session's diff: rc 1 for core.py)."""
    files = md.room_tests(ROOT, ("tests/core",), ["src/arl_tangram/core/core.py"])
    assert "tests/core/test_native.py" not in files
    assert "tests/core/test_core_actions.py" in files


def test_a_run_past_its_limit_is_interrupted_and_tears_down(tmp_path: Path) -> None:
    """Past the budget, pytest gets SIGINT first: its fixtures tear down what they started (a
    judge engine in a session of its own outlived a killed pytest: seen in this session's run)."""
    started, mark = tmp_path / "started", tmp_path / "torn-down"
    (tmp_path / "test_slow.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.fixture\ndef thing():\n"
        f"    open({str(started)!r}, 'w').close()\n    yield\n"
        f"    open({str(mark)!r}, 'w').close()\n\n\ndef test_slow(thing):\n    time.sleep(120)\n")
    env = {**md.os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    # (a budget the test surely starts within, even under coverage on a loaded machine: at 3 s
    # the interrupt once came during collection, before the fixture had anything to tear down)
    assert md._pytest(tmp_path, ["test_slow.py"], env, 20.0) == -1
    assert started.exists() and mark.exists()
