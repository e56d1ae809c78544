"""`benchmarks/golden_streams.py`, the guard for speed work: a recorded set of stream hashes
checks clean on a second run (the streams are deterministic), and a difference is caught."""

from __future__ import annotations

import pathlib

import pytest

from .benchmark_module import load_benchmark

ARGS = ["--only", "code-rl", "--cycles", "0"]  # the smallest workload, every policy: ~1 s



def test_record_check_and_a_difference(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    gs = load_benchmark("golden_streams")
    record = tmp_path / "golden.txt"
    assert gs.main(["--record", str(record), *ARGS]) == 0
    lines = record.read_text().splitlines()
    assert [x.split()[:2] for x in lines] == [["code-rl", p] for p in gs.POLICIES]
    assert all(len(x.split()[2]) == 16 for x in lines)
    assert gs.main(["--check", str(record), *ARGS]) == 0  # same seeds, same streams
    words = lines[1].split()
    words[2] = "0" * 16  # as if the stream of one policy had changed
    record.write_text("\n".join([lines[0], " ".join(words), *lines[2:]]) + "\n")
    capsys.readouterr()
    assert gs.main(["--check", str(record), *ARGS]) == 1
    out = capsys.readouterr().out
    assert out.count("DIFFERS") == 1 and f"code-rl {gs.POLICIES[1]} " in out
