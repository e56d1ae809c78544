"""replay/work.py's values (issue 43 item 2: the survivors of `make mutation` on it): the units
of work a trace's ``work_s`` becomes (``work_s x units_per_s``, rounded, never negative), the
processes the parallel part is forked over (the action's elastic maximum rounded up, one for a
rigid or serial action), and the program's exact text -- its units, parallel fraction and
workers as given (ints and a float), 2000 loop iterations a unit, and the session counter only
for a session's action. The program is also run here, in this process, serial only (one
worker: nothing forked), to show the counter it keeps in the interpreter's globals."""

from __future__ import annotations

import contextlib
import io

from arl_tangram.replay.work import UNIT_ITERS, program, units_for, workers_for


def test_units_are_work_seconds_times_the_calibrated_rate_rounded() -> None:
    assert units_for(0.5, 1000.0) == 500
    assert units_for(2.0, 1234.0) == 2468
    assert units_for(0.0014, 1000.0) == 1  # 1.4 units -> 1
    assert units_for(0.0016, 1000.0) == 2  # 1.6 units -> 2
    assert units_for(0.0004, 1000.0) == 0  # 0.4 units -> 0, not 1
    assert units_for(0.0, 5000.0) == 0
    assert units_for(-1.0, 10.0) == 0  # never negative
    assert isinstance(units_for(0.5, 1000.0), int)


def test_one_worker_for_a_rigid_serial_or_single_core_action() -> None:
    assert workers_for(None, 0.9) == 1  # rigid
    assert workers_for(4.0, 0.0) == 1  # elastic but all serial
    assert workers_for(4.0, -0.5) == 1
    assert workers_for(1.0, 0.9) == 1  # at most one core
    assert workers_for(0.5, 0.9) == 1


def test_workers_are_the_elastic_maximum_rounded_up() -> None:
    assert workers_for(4.0, 0.5) == 4
    assert workers_for(2.0, 1.0) == 2
    assert workers_for(2.5, 0.5) == 3
    assert workers_for(1.5, 0.01) == 2
    # a maximum a float's rounding left a hair above a whole number: that number, not one more
    assert workers_for(3.0000000001, 0.5) == 3
    assert workers_for(8.0, 1.0) == 8
    # just above one core: ceil gives 1 (the hair is under the tolerance), never 0 or 2
    assert workers_for(1.0000000005, 0.5) == 1


def test_the_program_text_holds_the_units_fraction_and_workers() -> None:
    assert UNIT_ITERS == 2000
    src = program(7, 0.25, 3)
    assert "        for i in range(2000):\n" in src
    assert "_units, _p, _w = 7, 0.25, 3\n" in src
    assert "_tangram_turns" not in src
    assert src.endswith("        os.waitpid(_pid, 0)\n")
    # the types as the template writes them: an int count of units and workers, a float fraction
    assert "_units, _p, _w = 7, 1.0, 2\n" in program(7.9, 1, 2.6)
    # the defaults: all serial, one worker, no session
    d = program(5)
    assert "_units, _p, _w = 5, 0.0, 1\n" in d
    assert d == program(5, 0.0, 1, session=False)
    compile(d, "<work>", "exec")


def test_a_session_program_counts_its_turns_in_the_interpreter() -> None:
    src = program(3, session=True)
    assert src.endswith('globals()["_tangram_turns"] = globals().get("_tangram_turns", 0) + 1\n'
                        'print("turn", _tangram_turns)\n')
    assert src.startswith(program(3))
    g: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(src, "<work>", "exec"), g)
        exec(compile(src, "<work>", "exec"), g)
    assert out.getvalue() == "turn 1\nturn 2\n"
    assert g["_units"] == 3 and g["_par"] == 0  # one worker: nothing parallel, nothing forked
