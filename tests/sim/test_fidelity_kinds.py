"""`benchmarks/fidelity_kinds.py amplify` (issue 39): the elastic trace predicted with the tests'
work x1.0 and x0.9 on a fixed spec, to the printed digit (the simulation is deterministic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .benchmark_module import load_benchmark

SPEC = """\
nodes:
- name: local
  capacity: {cpu: 2, memory_mb: 24106}
  parallel_speedup: {2: 1.6}
  dispatch_s: {default: 0.003, test: 0.0075, tool: 0.003}
calibration:
  units_per_s: 3000.0
  cold_start_s: 0.0025
  session_open_s: 0.006
"""


def test_amplify_prints_each_kind_and_its_move_with_the_tests_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fk = load_benchmark("fidelity_kinds")
    spec = tmp_path / "cal.yaml"
    spec.write_text(SPEC)
    assert fk.main(["amplify", str(spec), "--policies", "fifo,static-pool:2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "fifo            test 790.6 ms, tool 169.2 ms; tests' work x0.9: test -12.8%, tool -21.0%",
        "static-pool:2   test 822.7 ms, tool 341.5 ms; tests' work x0.9: test -24.0%, tool -22.4%",
    ]
