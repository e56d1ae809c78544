"""`api/jupyter_driver.py` run in this process (issue 43 item 2, helper-41): the program the
sandbox runs for ``/run_jupyter``, fed its input file in a scratch directory. Pinned: the
``_Capped`` stream's cut (exactly ``limit`` characters, ``truncated``), each cell's record as
Jupyter's messages carry it (``execute_result``/``display_data`` mime bundles in ``display``, an
``error`` as ename, evalue, traceback lines, no colour codes; stdout and stderr), variables kept
across cells, an error not stopping the next cell, the cell and total time limits (status
``TimeLimitExceeded``, the ``TimeoutError`` record word for word, later cells not run, the
output file rewritten after each cell) and the input file removed."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.api import jupyter_driver as D


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    old = signal.getsignal(signal.SIGALRM)
    InteractiveShell.clear_instance()
    yield tmp_path
    InteractiveShell.clear_instance()
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _run(
    cells: list[str], cell_timeout: float = 0, total: float = 30, **extra: Any
) -> dict[str, Any]:
    spec = {"cells": cells, "cell_timeout": cell_timeout, "total_timeout": total, **extra}
    Path(D.IN_FILE).write_text(json.dumps(spec))
    D.main()
    assert not os.path.exists(D.IN_FILE) and not os.path.exists(D.OUT_FILE + ".tmp")
    out: dict[str, Any] = json.loads(Path(D.OUT_FILE).read_text())
    return out


def test_file_names() -> None:
    assert (D.IN_FILE, D.OUT_FILE) == ("_tangram_jupyter_in.json", "_tangram_jupyter_out.json")
    assert issubclass(D._CellTimeout, BaseException)
    assert not issubclass(D._CellTimeout, Exception)


def test_capped_stream() -> None:
    c = D._Capped(5)
    assert (c.encoding, c.errors) == ("utf-8", "replace")
    assert not c.isatty() and c.writable() and c.flush() is None
    assert c.write("abc") == 3 and not c.truncated
    assert c.write("de") == 2 and not c.truncated and c.value() == "abcde"  # exactly the limit
    assert c.write("") == 0 and not c.truncated
    assert c.write("f") == 0 and c.truncated and c.value() == "abcde"
    c = D._Capped(4)
    assert c.write("abc") == 3 and c.write("def") == 1 and c.truncated
    assert (c.value(), c.size, c.parts) == ("abcd", 4, ["abc", "d"])
    c = D._Capped(3)
    assert c.write(12345) == 3 and c.value() == "123"  # (str() of what print passes)
    c = D._Capped(0)
    assert c.write("x") == 0 and c.truncated and c.parts == [] and c.size == 0


def test_cells_as_jupyter_records(workdir: Path) -> None:
    out = _run(
        [
            "a = 40",
            "print('hi'); import sys; print('e', file=sys.stderr); a + 2",
            "from IPython.display import display; display(7); 'x'",
            "1/0",
            "a",
            "undefined_name",
        ]
    )
    assert out["status"] == "Finished" and len(out["cells"]) == 6
    c0, c1, c2, c3, c4, c5 = out["cells"]
    assert c0 == {"stdout": "", "stderr": "", "display": [], "error": [], "truncated": False}
    assert c1 == {
        "stdout": "hi\n",
        "stderr": "e\n",
        "display": [{"text/plain": "42"}],
        "error": [],
        "truncated": False,
    }
    assert c2["display"] == [{"text/plain": "7"}, {"text/plain": "'x'"}]
    assert c3["stdout"] == "" and c3["display"] == []
    (err,) = c3["error"]
    assert list(err) == ["ename", "evalue", "traceback"]
    assert (err["ename"], err["evalue"]) == ("ZeroDivisionError", "division by zero")
    assert isinstance(err["traceback"], list) and err["traceback"]
    assert not any("\x1b[" in line for line in err["traceback"])  # no colour codes
    assert "ZeroDivisionError" in err["traceback"][-1]
    assert c4["display"] == [{"text/plain": "40"}] and c4["error"] == []  # state kept
    assert c5["error"][0]["ename"] == "NameError"
    assert c5["error"][0]["evalue"] == "name 'undefined_name' is not defined"


def test_clear_output_and_a_cut_cell(workdir: Path) -> None:
    out = _run(
        [
            "from IPython.display import display, clear_output\n"
            "display(1); clear_output(); display(2)",
            "print('x' * 10)",
            "print('ok')",
        ],
        max_output=6,
    )
    c0, c1, c2 = out["cells"]
    assert c0["display"] == [{"text/plain": "2"}]
    assert (c1["stdout"], c1["truncated"]) == ("xxxxxx", True)
    assert (c2["stdout"], c2["truncated"]) == ("ok\n", False)  # the cap is per cell


def test_stderr_cut_sets_truncated(workdir: Path) -> None:
    out = _run(["import sys; sys.stderr.write('y' * 9)"], max_output=4)
    (c,) = out["cells"]
    assert (c["stdout"], c["stderr"], c["truncated"]) == ("", "yyyy", True)


def test_default_cap_is_one_mib(workdir: Path) -> None:
    out = _run(["print('z' * (1 << 20))"])  # no max_output: 1 MiB
    (c,) = out["cells"]
    assert (len(c["stdout"]), c["truncated"]) == (1 << 20, True)


def test_cell_time_limit(workdir: Path) -> None:
    out = _run(["import time", "print('a'); time.sleep(5)", "print('never')"], cell_timeout=0.3)
    assert out["status"] == "TimeLimitExceeded" and len(out["cells"]) == 2
    c = out["cells"][1]
    assert c["error"] == [
        {
            "ename": "TimeoutError",
            "evalue": "cell exceeded 0.3 s",
            "traceback": ["TimeoutError: cell exceeded 0.3 s"],
        }
    ]
    assert c["stdout"] == "a\n" and c["truncated"] is False
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left behind


def test_a_cell_that_catches_exception_is_still_stopped(workdir: Path) -> None:
    out = _run(
        [
            "import time\ntry:\n    time.sleep(5)\nexcept Exception:\n    print('ate it')",
            "print('never')",
        ],
        cell_timeout=0.2,
    )
    assert out["status"] == "TimeLimitExceeded" and len(out["cells"]) == 1
    assert out["cells"][0]["error"][0]["evalue"] == "cell exceeded 0.2 s"
    assert out["cells"][0]["stdout"] == ""


def test_total_time_limit(workdir: Path) -> None:
    out = _run(
        ["import time; time.sleep(0.3)", "time.sleep(5)", "print('never')"],
        cell_timeout=10,
        total=1.5,
    )
    assert out["status"] == "TimeLimitExceeded" and len(out["cells"]) == 2
    assert out["cells"][0]["error"] == []
    ev = out["cells"][1]["error"][0]["evalue"]
    assert ev.startswith("cell exceeded ") and ev.endswith(" s")
    limit = float(ev.split()[2])
    # what was left of 1.5 s after a cell of at least 0.3 s, not the 10 s per cell (a margin
    # for a loaded machine: the first cell may take up to 1.5 s and still leave some)
    assert 0 < limit <= 1.2


def test_no_time_left_runs_no_cell(workdir: Path) -> None:
    out = _run(["import time; time.sleep(0.25)", "print('never')"], total=0.2)
    assert out["status"] == "TimeLimitExceeded"
    assert len(out["cells"]) == 1 and out["cells"][0]["error"][0]["ename"] == "TimeoutError"
    out2 = _run(["print(1)"], total=1e-9)
    assert out2 == {"status": "TimeLimitExceeded", "cells": []}


def test_zero_cell_timeout_means_none(workdir: Path) -> None:
    out = _run(["import time; time.sleep(0.2); print('done')"], cell_timeout=0, total=5)
    assert out["status"] == "Finished" and out["cells"][0]["stdout"] == "done\n"


def test_output_written_after_every_cell(workdir: Path) -> None:
    seen = Path("seen.txt")
    out = _run(
        [
            "import json",
            f"print(open({D.OUT_FILE!r}).read())",
            f"open({str(seen)!r}, 'w').write(open({D.OUT_FILE!r}).read())",
        ]
    )
    # before any cell ran: the empty, finished notebook; after two: both cells
    assert json.loads(out["cells"][1]["stdout"]) == {
        "status": "Finished",
        "cells": [{"stdout": "", "stderr": "", "display": [], "error": [], "truncated": False}],
    }
    mid = json.loads(seen.read_text())
    assert mid["status"] == "Finished" and len(mid["cells"]) == 2
    assert mid["cells"][1]["stdout"] == out["cells"][1]["stdout"]


def test_empty_notebook(workdir: Path) -> None:
    assert _run([]) == {"status": "Finished", "cells": []}


def test_alarm_raises_cell_timeout() -> None:
    with pytest.raises(D._CellTimeout):
        D._alarm(signal.SIGALRM, None)


def test_write_replaces_atomically(workdir: Path) -> None:
    D._write({"a": 1})
    assert json.loads(Path(D.OUT_FILE).read_text()) == {"a": 1}
    assert sorted(os.listdir(workdir)) == [D.OUT_FILE]


def test_history_numbers_cells_but_keeps_no_file(workdir: Path) -> None:
    """In/Out and ``_N`` as in a kernel (store_history), no history database written."""
    out = _run(["40 + 2", "_1", "In[1]", "get_ipython().execution_count"])
    assert [c["display"] for c in out["cells"]] == [
        [{"text/plain": "42"}],
        [{"text/plain": "42"}],
        [{"text/plain": "'40 + 2'"}],
        [{"text/plain": "5"}],
    ]
    written = [f for _, _, fs in os.walk(workdir / "ipython") for f in fs]
    assert not [f for f in written if "history" in f], written


def test_first_write_is_the_empty_notebook(workdir: Path) -> None:
    out = _run([f"print(open({D.OUT_FILE!r}).read())"])
    assert json.loads(out["cells"][0]["stdout"]) == {"status": "Finished", "cells": []}


def test_a_limit_hit_outside_the_cells_code_stops_the_notebook(workdir: Path) -> None:
    """The alarm may fire while IPython compiles a long cell (outside the code it runs)."""
    big = "\n".join(f"a{i} = {i}" for i in range(100000))
    out = _run([big, "print('never')"], cell_timeout=0.05)
    assert out["status"] == "TimeLimitExceeded" and len(out["cells"]) == 1
    assert out["cells"][0]["error"] == [
        {
            "ename": "TimeoutError",
            "evalue": "cell exceeded 0.05 s",
            "traceback": ["TimeoutError: cell exceeded 0.05 s"],
        }
    ]


def test_no_time_left_exactly(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A limit of exactly 0 s left is no time left (a 0 limit would mean none to the timer)."""
    from types import SimpleNamespace

    monkeypatch.setattr(D, "time", SimpleNamespace(monotonic=lambda: 100.0))
    assert _run(["print(1)"], cell_timeout=5, total=0) == {
        "status": "TimeLimitExceeded",
        "cells": [],
    }


def test_shell_set_up_warns_of_nothing(workdir: Path) -> None:
    """The colour scheme is named as IPython 9 spells it (no deprecation on the driver's
    stderr, which /run_jupyter answers as ``driver.stderr``)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert _run(["1"])["cells"][0]["display"] == [{"text/plain": "1"}]
