#!/usr/bin/env python3
"""Replay the 28 planted mutations of the test audit (reviews/tests-2026-11.md), one at a time,
each in a throw-away copy of the committed tree, and report which test catches each (issue 27).

usage: scripts/audit_mutations.py [--only ID,ID] [--out FILE.json] [--keep]

Method (the audit's, made repeatable): `git archive HEAD` (src, tests, .ci, pyproject.toml) into
a temporary directory, plus the compiled CPU fast path if built here; for each mutation a fresh
copy of `src/` gets ONE exact text replacement (the text must occur exactly once in exactly one
file under the named package directory, so the mutation follows a file that moved), then
`python -m pytest -x` runs the named tests of that copy with PYTHONPATH pointing at it (child
processes -- the fork server, `tangram serve`, Ray workers -- inherit it). Everything runs on
the pure-Python core (ARL_TANGRAM_PURE=1: the copy has no compiled core, and a core edit must
reach the code that runs). Caught = pytest failed; the first failing test is recorded.
Needs root (the sandbox mutations run real sandboxes) and the project venv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "src/arl_tangram"


@dataclass(frozen=True)
class Mutation:
    id: str
    where: str  # directory under src/arl_tangram holding the file (searched recursively)
    what: str
    old: str
    new: str
    tests: tuple[str, ...]


CORE = ("tests/core/test_weight_order.py", "tests/core/test_queue_keys.py",
        "tests/core/test_core_actions.py", "tests/core/test_core_models.py",
        "tests/core/test_core_sessions_pools.py", "tests/core/test_core_stateful.py")
SIM = ("tests/sim/test_bound_values.py", "tests/sim/test_bounds.py",
       "tests/sim/test_honest_baselines.py")
CPU = ("tests/managers/cpu/test_cpu_clone_flags.py", "tests/managers/cpu/test_cpu_sandbox.py",
       "tests/managers/cpu/test_cpu_hostile.py", "tests/managers/cpu/test_cpu_seccomp.py")
GPU = ("tests/managers/gpu/test_gpu_judge_formula.py", "tests/managers/gpu/test_gpu_manager.py")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("C1", "core", "rank: weight inverted (est*share/weight -> *weight)",
             "/ rec.spec.weight  # max(share, 1e-3)", "* rec.spec.weight  # max(share, 1e-3)", CORE),
    Mutation("C2", "core", "elastic growth ignores the node's spare capacity",
             "delta = min(el.max - k, spare)", "delta = el.max - k", CORE),
    Mutation("C3", "core/records.py", "free capacity booked as cap - this allotment",
             "u = used.get(k, 0.0) + v\n            used[k] = u\n            free[k] = cap.get(k, 0.0) - u",
             "u = used.get(k, 0.0) + v\n            used[k] = u\n            free[k] = cap.get(k, 0.0) - v", CORE),
    Mutation("C4", "core", "node loss re-runs non-idempotent actions too",
             "if rec.spec.idempotent and rec.spec.session is None:",
             "if rec.spec.session is None:", CORE),
    Mutation("C5", "core", "the per-kind FIFO floor removed",
             "if got is not None and got[0] > rank:", "if False and got is not None:", CORE),
    Mutation("C6", "core", "half-octave classes -> octave classes",
             "return 2 * e + (m >= _SQRT_HALF) + _RANK0", "return 2 * e + _RANK0", CORE),
    Mutation("C7", "core", "node loss re-runs idempotent actions of a session",
             "if rec.spec.idempotent and rec.spec.session is None:",
             "if rec.spec.idempotent:", CORE),
    Mutation("B1", "sim", "elastic bound not capped by the largest node",
             "k = min(el.max, largest.get(el.dim, el.max))", "k = el.max", SIM),
    Mutation("B2", "sim", "bound not capped at the timeout",
             "return t if 0.0 < t < b else b", "return b", SIM),
    Mutation("B3", "sim", "step bound drops the generation times",
             "t += gen + b", "t += b", SIM),
    Mutation("P1", "managers/cpu", "sandbox memory limit x4",
             "return int(mb * (1 << 20))", "return int(mb * (1 << 22))", CPU),
    Mutation("P3", "managers/cpu", "CPU quota doubled",
             "quota = max(1000, int(cores * _PERIOD_US))",
             "quota = max(1000, int(2 * cores * _PERIOD_US))", CPU),
    Mutation("S1", "managers/cpu", "io_uring_setup removed from the deny list",
             '"io_uring_setup", "io_uring_enter"', '"io_uring_enter"', CPU),
    Mutation("S2", "managers/cpu", "CLONE_NEWUSER dropped from the clone flag filter",
             "0x08000000, 0x10000000,", "0x08000000,", CPU),
    Mutation("U1", "managers/cpu", "fork server's sandbox uid -> 0",
             '"uid": cfg.sandbox_uid, "gid": cfg.sandbox_gid, "hostname"',
             '"uid": 0, "gid": cfg.sandbox_gid, "hostname"', CPU),
    Mutation("U2", "managers/cpu", "the job's uid -> 0",
             '"limits": {"uid": cfg.sandbox_uid, "gid": cfg.sandbox_gid,\n',
             '"limits": {"uid": 0, "gid": cfg.sandbox_gid,\n', CPU),
    Mutation("H1", "managers/cpu", "hidden_paths ignored",
             '"hidden_paths": _inside([os.path.realpath(p) for p in cfg.hidden_paths], ro),',
             '"hidden_paths": [],', ("tests/managers/cpu/test_cpu_host_hidden.py",)),
    Mutation("A1", "api", "any Bearer token accepted",
             "if hmac.compare_digest(got, expected):",
             'if got.startswith(b"Bearer "):', ("tests/api/test_api.py",)),
    Mutation("A2", "api", "streamed body limit doubled",
             "if seen > limit:", "if seen > 2 * limit:", ("tests/api/test_body_limit_boundary.py",
                                                           "tests/api/test_api.py")),
    Mutation("A3", "api", 'the empty host counts as loopback',
             'return host == "localhost"', "return True", ("tests/api/test_serve_bind_guard.py",
                                                          "tests/api/test_cli_serve.py")),
    Mutation("I1", "api", "Idempotency-Key header ignored",
             "(tenant, idempotency_key or body.idempotency_key)", "(tenant, body.idempotency_key)",
             ("tests/api/test_api.py",)),
    Mutation("I2", "runtime", "idempotency keys expire after result_ttl_s",
             "if t + self.config.idempotency_ttl_s > now:", "if t + self.config.result_ttl_s > now:",
             ("tests/runtime/test_idempotency_ttl.py", "tests/api/test_api.py")),
    Mutation("G1", "managers/gpu", "batch rows mapped back to the wrong inputs",
             "for j, i in enumerate(group):", "for j, i in enumerate(sorted(group)):", GPU),
    Mutation("G2", "managers/gpu", "an action naming another model still scored",
             "instance serves {inst.spec.name!r}\"\n                continue\n",
             "instance serves {inst.spec.name!r}\"\n", GPU),
    Mutation("G4", "managers/gpu", "judge score p_yes instead of p_yes/(p_yes+p_no)",
             '"score": p_yes / (p_yes + p_no),', '"score": p_yes,', GPU),
    Mutation("R1", "runtime", "events polled after the loss are delivered",
             "            if node.state is not _State.UP:\n                return  # late results",
             "            if False:\n                return  # late results",
             ("tests/ray/test_ray_membership_loss.py", "tests/ray/test_ray_executor.py")),
    Mutation("R2", "runtime", "membership watch no longer reports a dead node lost",
             '                self._lose(node, "node lost: Ray node died")', "                pass",
             ("tests/ray/test_ray_membership_loss.py",)),
    Mutation("R3", "runtime", "NodeLost only when membership finds the node dead",
             "        if was_up and not self._closed:",
             '        if was_up and not self._closed and "Ray node died" in reason:',
             ("tests/ray/test_ray_crash.py",)),
)


def _apply(src: Path, m: Mutation) -> Path:
    base = src / "arl_tangram" / m.where
    files = [base] if base.is_file() else sorted(base.rglob("*.py"))
    hits = [(f, f.read_text().count(m.old)) for f in files]
    hits = [(f, n) for f, n in hits if n]
    if len(hits) != 1 or hits[0][1] != 1:
        raise SystemExit(f"{m.id}: {m.old!r} must occur once in one file under {base}; "
                         f"found {[(str(f), n) for f, n in hits]}")
    f = hits[0][0]
    f.write_text(f.read_text().replace(m.old, m.new))
    return f


def _first_failure(out: str) -> str:
    for line in out.splitlines():
        mm = re.match(r"^(FAILED|ERROR) (\S+)", line)
        if mm:
            return mm.group(2)
    return ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    work = Path(tempfile.mkdtemp(prefix="tangram-mut-"))
    base = work / "base"
    base.mkdir()
    arch = subprocess.run(["git", "archive", "HEAD", "src", "tests", ".ci", "pyproject.toml"],
                          cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=arch, check=True)
    for so in (ROOT / PKG / "managers/cpu").rglob("_fastpath*.so"):
        dst = base / so.relative_to(ROOT)
        if dst.parent.is_dir():
            shutil.copy2(so, dst)
    py = str(ROOT / ".venv/bin/python")
    results = []
    for m in MUTATIONS:
        if only and m.id not in only:
            continue
        tree = work / m.id
        shutil.copytree(base, tree, symlinks=True)
        f = _apply(tree / "src", m)
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "ARL_TANGRAM_PURE": "1"}
        env.pop("TANGRAM_SKIP_LOG", None)
        t0 = time.monotonic()
        try:
            p = subprocess.run([py, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider",
                                *m.tests], cwd=tree, env=env, capture_output=True, text=True,
                               timeout=args.timeout)
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = -1, f"timeout after {args.timeout}s\n{e.stdout or ''}"
        wall = time.monotonic() - t0
        tail = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        r = {"id": m.id, "file": str(f.relative_to(tree)), "what": m.what,
             "caught": rc not in (0, 5), "rc": rc, "by": _first_failure(out),
             "summary": tail[-1] if tail else out[-300:], "wall_s": round(wall, 1)}
        results.append(r)
        print(f"{m.id:3} {'CAUGHT ' if r['caught'] else 'SURVIVED'} {r['by'] or '-'}  "
              f"[{r['summary'].strip()}] {wall:.0f}s  ({r['file']})", flush=True)
        if not args.keep:
            shutil.rmtree(tree, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    caught = sum(r["caught"] for r in results)
    print(f"{caught}/{len(results)} caught")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
