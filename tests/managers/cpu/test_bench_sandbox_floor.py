"""The floor measurements of `benchmarks/bench_sandbox.py` run and measure what they say."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sim"))
from benchmark_module import load_benchmark

bench = load_benchmark("bench_sandbox")


def test_fork_floor_forks_runs_and_reaps() -> None:
    got = bench.fork_floor(("json",), 20)
    assert set(got) == {"parent", "child", "parent_flt", "child_flt"}
    # each child runs Python (compile, exec, print) in a forked copy: it takes page faults
    assert got["child_flt"] > 10 and got["child"] > 0
    assert got["parent"] >= 0


def test_fork_floor_raises_when_its_program_fails() -> None:
    with pytest.raises(subprocess.CalledProcessError):  # never a figure from a broken run
        bench.fork_floor(("no_such_module_here",), 2)


@pytest.mark.needs_root
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler")
def test_isolation_floor_runs_every_step() -> None:
    # ns_floor.c exits non-zero (and the benchmark raises) if any namespace or mount step fails
    got = bench.isolation_floor(20)
    assert got is not None
    isolated, bare = got
    assert isolated > 0 and bare > 0


def _floor_cgroups() -> list[str]:
    base = "/sys/fs/cgroup/memory" if os.path.isdir("/sys/fs/cgroup/memory") else "/sys/fs/cgroup"
    return [d for d in os.listdir(base) if d.startswith("tangram-floor-")]


@pytest.mark.needs_root
def test_loaded_floor_measures_both_variants_and_leaves_nothing_behind() -> None:
    pytest.importorskip("arl_tangram.managers.cpu.zygote._fastpath")
    before_mounts = Path("/proc/self/mounts").read_text()
    for isolate in (False, True):
        got = bench.loaded_floor(("json",), 16, isolate=isolate)
        assert got["cpu"] > 0 and got["rate"] > 0
    assert not _floor_cgroups()
    assert Path("/proc/self/mounts").read_text() == before_mounts  # every mount stayed inside


def test_loaded_floor_raises_when_its_program_fails() -> None:
    with pytest.raises(subprocess.CalledProcessError):  # never a figure from a broken run
        bench.loaded_floor(("no_such_module_here",), 8, isolate=False)
