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
        ("tests/managers/cpu/test_cpu_*.py",)
    assert md.room_of("src/arl_tangram/specfile.py") == ("tests",)
    files = md._mentioning(ROOT, ["tests/api"], ["src/arl_tangram/api/jupyter.py"])
    assert "tests/api/test_jupyter_translate.py" in files
