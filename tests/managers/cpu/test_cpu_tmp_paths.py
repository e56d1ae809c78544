"""Read-only host paths under /tmp (a CI checkout's virtualenv, say) are importable in sandboxes.

Each sandbox has its own /tmp, so such paths are bound elsewhere (`zygote.sandbox_path`); the
fork server's import paths must follow them, or `import <anything not preloaded>` fails there.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

pytestmark = pytest.mark.integration


async def test_package_under_tmp_imports_inside_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    pkgs = tempfile.mkdtemp(prefix="tangram-tmp-site-", dir="/tmp")
    os.chmod(pkgs, 0o755)
    os.makedirs(f"{pkgs}/reloc_probe_pkg")
    with open(f"{pkgs}/reloc_probe_pkg/__init__.py", "w") as f:
        f.write("VALUE = 41\n")
    with open(f"{pkgs}/reloc_probe_pkg/sub.py", "w") as f:
        f.write("from . import VALUE\nPLUS = VALUE + 1\n")
    for p in (pkgs, f"{pkgs}/reloc_probe_pkg"):
        os.chmod(p, 0o755)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [pkgs, *filter(None, [os.environ.get("PYTHONPATH")])]))
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                    sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                    extra_ro_paths=(pkgs,), warm_min=1, warm_max=2,
                                    preload_modules=("reloc_probe_pkg",)))
    try:
        await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    try:
        # preloaded package, then a submodule imported lazily through its (relocated) __path__
        r = await m.run(action("import reloc_probe_pkg.sub as s\nprint(s.PLUS)"), allot())
        assert r.to_dict()["run_result"]["stdout"] == "42\n", r.to_dict()
        r = await m.run(action("import os\nprint(os.path.exists('/tmp/' + 'x'))"), allot())
        assert r.to_dict()["run_result"]["stdout"] == "False\n"  # /tmp is still the sandbox's own
    finally:
        await m.aclose()
