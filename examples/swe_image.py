"""Build the SWE example image (issues 17, 26) from Debian's packages, once per machine.

``python examples/swe_image.py [--cache DIR]`` prints the path of an OCI image layout shaped like
SWE-bench's images (no ``USER``: everything is root's, and sessions run as root inside their
user namespace, docs/sandbox.md "The image's own user"), with two layers:
1. Debian bookworm ``minbase`` + python3, python3-venv, python3-pytest, python3-wheel and git,
   made by ``mmdebstrap`` (installed by scripts/system-deps.sh; needs Debian's package mirror),
   without /dev nodes, and the task's environment at /opt/testbed: a virtual environment
   (``python3 -m venv --system-site-packages``, so Debian's pytest is in it), root's;
2. a small repository at /testbed, root's, 0755/0644 (a package ``calc`` whose ``mean`` of an
   empty list raises ZeroDivisionError, a test that expects 0.0, and a ``pyproject.toml``, so
   ``pip install -e .`` installs it into /opt/testbed), committed with git.
The config: ``WorkingDir`` /testbed, ``PATH`` with /opt/testbed/bin first, ``Cmd`` /bin/bash.

The result is cached under ``--cache`` (default /var/cache/arl-tangram/images) by a hash of
this recipe, so later calls return at once; a build goes to a temporary directory beside it
and is renamed into place when complete.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from arl_tangram.managers.cpu.images import imagekit

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python3-pytest", "python3-wheel", "git")
ENV = "/opt/testbed"  # the task's environment, as SWE-bench's /opt/miniconda3/envs/testbed
REPO = "/testbed"
DEFAULT_CACHE = "/var/cache/arl-tangram/images"

CALC = '''"""A tiny statistics module (the SWE example's repository)."""


def mean(xs):
    """The arithmetic mean of ``xs``; 0.0 for an empty list."""
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return 0.0
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
'''

TESTS = '''from calc import mean, median


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_mean_of_nothing_is_zero():
    assert mean([]) == 0.0


def test_median():
    assert median([3, 1, 2]) == 2
    assert median([]) == 0.0
'''

# what the scripted agent applies (examples/swe_agent.py)
FIX = '''--- a/calc.py
+++ b/calc.py
@@ -3,7 +3,9 @@
\x20
 def mean(xs):
     """The arithmetic mean of ``xs``; 0.0 for an empty list."""
-    return sum(xs) / len(xs)
+    if not xs:
+        return 0.0
+    return sum(xs) / len(xs)
\x20
\x20
 def median(xs):
'''

PYPROJECT = '''[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "calc"
version = "0.1.0"

[tool.setuptools]
py-modules = ["calc"]
'''

RECIPE = repr((SUITE, PACKAGES, CALC, TESTS, PYPROJECT, ENV, REPO, "v2"))


def _repo_layer(work: str) -> str:
    top = os.path.join(work, "repo-layer")
    repo = top + REPO
    os.makedirs(repo)
    os.makedirs(os.path.join(top, "etc"))
    with open(os.path.join(top, "etc", "gitconfig"), "w") as f:
        f.write("[user]\n\tname = agent\n\temail = agent@example.com\n")
    for name, text in (("calc.py", CALC), ("test_calc.py", TESTS), ("pyproject.toml", PYPROJECT),
                       ("README.md", "calc: mean and median.\n"), (".gitignore", "*.egg-info/\n")):
        with open(os.path.join(repo, name), "w") as f:
            f.write(text)
    env = {**os.environ, "GIT_AUTHOR_NAME": "example", "GIT_AUTHOR_EMAIL": "e@example.com",
           "GIT_COMMITTER_NAME": "example", "GIT_COMMITTER_EMAIL": "e@example.com",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "."],
                ["git", "commit", "-q", "-m", "calc: mean and median"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True)
    for d, _dirs, files in os.walk(top):  # root's, as in SWE-bench's images
        os.chown(d, 0, 0)
        os.chmod(d, 0o755)
        for n in files:
            os.chown(os.path.join(d, n), 0, 0)
            os.chmod(os.path.join(d, n), 0o644)
    return imagekit.pack_layer(top, os.path.join(work, "repo.tar"))


def build(cache: str = DEFAULT_CACHE, say=print) -> str:  # type: ignore[no-untyped-def]
    """The OCI layout of the SWE example image, built now if this machine has none."""
    key = hashlib.sha256(RECIPE.encode()).hexdigest()[:16]
    out = os.path.join(cache, f"swe-debian-{key}")
    if os.path.exists(os.path.join(out, "index.json")):
        return out
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is not installed (scripts/system-deps.sh installs it)")
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix="build-", dir=cache)
    try:
        base = os.path.join(work, "base.tar")
        say(f"swe image: mmdebstrap {SUITE} minbase + {' '.join(PACKAGES)} ...")
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase",
                        "--include=" + ",".join(PACKAGES), "--skip=output/dev",
                        "--aptopt=Acquire::Retries \"3\"",
                        f"--customize-hook=chroot \"$1\" python3 -m venv "
                        f"--system-site-packages {ENV}",
                        SUITE, base, MIRROR], check=True)
        layout = os.path.join(work, "oci")
        imagekit.write_oci_layout(layout, [base, _repo_layer(work)],
                                  {"Env": [f"PATH={ENV}/bin:/usr/local/sbin:/usr/local/bin:"
                                           "/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
                                   "WorkingDir": REPO, "Cmd": ["/bin/bash"]},
                                  ref="swe-example")
        os.rename(layout, out)
        say(f"swe image: {out}")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=DEFAULT_CACHE)
    args = ap.parse_args()
    print(build(args.cache, say=lambda m: print(m, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
