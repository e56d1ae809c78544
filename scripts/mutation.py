#!/usr/bin/env python3
"""`make mutation`: mutmut over the modules of pyproject's [tool.mutmut], in a copy of the
committed tree (HEAD), and the score per module (issue 27; docs/testing.md).

usage: scripts/mutation.py [--tests PATH ...] [--keep] [MUTANT_GLOB ...]

  MUTANT_GLOB   mutmut's names, e.g. 'arl_tangram.api.middleware*' (default: every module)
  --tests       run these test files instead of the configured selection (a quicker run of a
                few modules; written into the copy's pyproject only)
  --keep        keep the copy (then `cd` there and `mutmut show NAME` / `mutmut browse`)

The copy keeps others' work in progress and mutmut's `mutants/` out of the checkout. The core
runs as pure Python (ARL_TANGRAM_PURE=1: a mutated core module must be the one that runs) and
child processes (the sandbox fork server, `tangram serve`) see the mutated sources through
PYTHONPATH. Score = killed / (killed + survived + timeout); mutants with no test (not covered)
are listed apart, never counted as killed.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"


def _copy() -> Path:
    work = Path(tempfile.mkdtemp(prefix="tangram-mutmut-"))
    arch = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=arch, check=True)
    for so in (ROOT / "src/arl_tangram/managers/cpu").rglob("_fastpath*.so"):  # built, untracked
        dst = work / so.relative_to(ROOT)
        if dst.parent.is_dir():
            shutil.copy2(so, dst)
    return work


def _select_tests(copy: Path, tests: list[str]) -> None:
    p = copy / "pyproject.toml"
    text = p.read_text()
    new = "pytest_add_cli_args_test_selection = [\n" + "".join(f'    "{t}",\n' for t in tests) + "]\n"
    text, n = re.subn(r"pytest_add_cli_args_test_selection = \[\n(?:.*\n)*?\]\n", new, text)
    if n != 1:
        raise SystemExit("pyproject.toml: no pytest_add_cli_args_test_selection to replace")
    p.write_text(text)


def _module(name: str) -> str:
    # arl_tangram.api.middleware.x_is_loopback__mutmut_3 -> arl_tangram.api.middleware
    head = name.split("__mutmut_")[0]
    return head.rsplit(".", 1)[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", nargs="*", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("globs", nargs="*")
    args = ap.parse_args()
    copy = _copy()
    if args.tests:
        _select_tests(copy, args.tests)
    # (made now: a PYTHONPATH entry missing at start-up may be cached as "nothing here")
    (copy / "mutants" / "src").mkdir(parents=True)
    env = {**os.environ, "ARL_TANGRAM_PURE": "1", "PYTHONPATH": str(copy / "mutants" / "src")}
    env.pop("TANGRAM_SKIP_LOG", None)
    print(f"mutation: mutmut in {copy}", flush=True)
    run = subprocess.run([str(BIN / "mutmut"), "run", *args.globs], cwd=copy, env=env)
    res = subprocess.run([str(BIN / "mutmut"), "results", "--all", "true"], cwd=copy, env=env,
                         capture_output=True, text=True)
    by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    survivors: dict[str, list[str]] = collections.defaultdict(list)
    for line in res.stdout.splitlines():
        m = re.match(r"^\s*([\w.]+__mutmut_\d+): (.+)$", line)
        if not m:
            continue
        name, status = m.group(1), m.group(2).strip()
        mod = _module(name)
        if args.globs and not any(_match(name, g) for g in args.globs):
            continue
        by[mod][status] += 1
        if status in ("survived", "timeout", "no tests", "suspicious"):
            survivors[mod].append(f"{name}: {status}")
    print("\nmodule                                   killed survived timeout no-tests  score")
    for mod in sorted(by):
        c = by[mod]
        judged = c["killed"] + c["survived"] + c["timeout"]
        score = c["killed"] / judged if judged else 0.0
        print(f"{mod:40} {c['killed']:6} {c['survived']:8} {c['timeout']:7} {c['no tests']:8}"
              f"  {score:6.1%}")
    for mod in sorted(survivors):
        print(f"\n{mod}: not killed")
        for s in survivors[mod]:
            print(f"  {s}")
    if args.keep:
        print(f"\nkept: {copy}  (cd there; {BIN}/mutmut show NAME)")
    else:
        shutil.rmtree(copy, ignore_errors=True)
    return run.returncode


def _match(name: str, glob: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, glob)


if __name__ == "__main__":
    sys.exit(main())
