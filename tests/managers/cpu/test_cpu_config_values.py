"""The CPU manager's configuration (`managers/cpu/config.py`), asserted exactly (issue 43).

- every default of `CpuManagerConfig` and `DEFAULT_PRELOAD`; the class is keyword-only, frozen
  and slotted;
- every refusal word for word, each at its boundary (the last value refused, the first one
  accepted), bools refused where the check says so;
- `image_cache_dir` (images_dir; a tmpfs work_root -> /var/tmp; else work_root/images) and
  `image_limits` (MiB -> bytes).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile

import pytest

from arl_tangram.managers.cpu import config as cfgmod
from arl_tangram.managers.cpu.config import DEFAULT_PRELOAD, CpuManagerConfig
from arl_tangram.managers.cpu.images import layers

C = CpuManagerConfig


def test_defaults():
    c = C()
    assert c.work_root == os.path.join(tempfile.gettempdir(), "tangram-cpu")
    want = {
        "workdir_max_mb": 256,
        "allow_reduced_isolation": False,
        "sandbox_uid": 65534,
        "sandbox_gid": 65534,
        "sandbox_id_base": 536870912,
        "sandbox_id_count": 65536,
        "output_limit_bytes": 1048576,
        "warm_min": 2,
        "warm_max": 32,
        "default_memory_mb": 512,
        "default_cpus": 1.0,
        "squeezed_weight": 0.0,
        "sandbox_weight": 1.0,
        "entitled_tree_weight": False,
        "squeezed_cpus": True,
        "pids_max": 256,
        "default_compile_timeout_s": 30.0,
        "default_run_timeout_s": 10.0,
        "max_timeout_s": 600.0,
        "max_test_cases": 1024,
        "max_open_files": 1024,
        "preload_modules": DEFAULT_PRELOAD,
        "extra_ro_paths": (),
        "hidden_paths": (),
        "syscall_filter": True,
        "session_reap_interval_s": 1.0,
        "fork_server_max_crashes": 5,
        "fork_server_crash_window_s": 60.0,
        "fork_server_restart_backoff_s": 0.1,
        "fork_server_down_retry_s": 30.0,
        "hostname": "sandbox",
        "direct_python": True,
        "share_code_ptes": False,
        "warm_direct": True,
        "compiled_setup": True,
        "cgroup_self_join": True,
        "images_dir": "",
        "image_layer_mb": 1024,
        "freeze_sessions": True,
        "frozen_memory_refresh": 20,
        "image_max_mb": 16384,
        "image_max_files": 300000,
        "image_max_ratio": 200.0,
        "image_tenant_max_mb": 65536,
        "image_store_max_mb": 0,
        "image_min_free_mb": 2048,
        "layers_on_disk": True,
        "layers_dir": "",
        "layer_budget_mb": 0,
        "layers_warm": 2,
        "layer_reservations": {},
        "image_userns": True,
        "image_id_base": 1073741824,
        "image_id_count": 65536,
    }
    got = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "work_root"}
    assert got == want
    for k, v in want.items():  # types too (1.0 == 1, True == 1)
        assert type(got[k]) is type(v), k
    assert C().layer_reservations is not c.layer_reservations  # (a fresh dict each)


def test_preload_list():
    assert DEFAULT_PRELOAD == (
        "os", "sys", "re", "json", "math", "cmath", "collections", "collections.abc",
        "itertools", "functools", "operator", "typing", "random", "string", "heapq", "bisect",
        "datetime", "time", "decimal", "fractions", "statistics", "copy", "dataclasses", "io",
        "enum", "hashlib", "textwrap", "traceback", "array", "struct", "unittest", "contextlib",
        "abc", "numbers",
    )  # fmt: skip


def test_keyword_only_frozen_slotted():
    with pytest.raises(TypeError):
        C("/tmp/x")  # type: ignore[misc]
    c = C()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.warm_min = 3  # type: ignore[misc]
    assert not hasattr(c, "__dict__")


def _refused(msg: str, **kw) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        C(**kw)


POSITIVE = ["image_max_mb", "image_max_files", "image_max_ratio", "workdir_max_mb",
            "output_limit_bytes", "default_memory_mb", "default_cpus", "pids_max",
            "default_compile_timeout_s", "default_run_timeout_s", "max_timeout_s",
            "max_open_files", "session_reap_interval_s", "image_layer_mb", "max_test_cases",
            "fork_server_crash_window_s", "fork_server_restart_backoff_s",
            "fork_server_down_retry_s"]  # fmt: skip


@pytest.mark.parametrize("name", POSITIVE)
def test_positive(name):
    for bad in (0, -1, True, "5", None):
        _refused(f"{name} must be a positive number, got {bad!r}", **{name: bad})
    if name != "pids_max":
        assert getattr(C(**{name: 0.5}), name) == 0.5
        assert getattr(C(**{name: 1}), name) == 1


@pytest.mark.parametrize("name", ["image_tenant_max_mb", "image_store_max_mb",
                                  "image_min_free_mb", "layer_budget_mb", "layers_warm",
                                  "frozen_memory_refresh"])  # fmt: skip
def test_non_negative_int(name):
    for bad in (-1, True, False, 1.0, "3"):
        _refused(f"{name} must be an integer >= 0, got {bad!r}", **{name: bad})
    assert getattr(C(**{name: 0}), name) == 0


def test_squeezed_weight():
    for bad in (-0.01, 1.01, True, False, "0.5", None):
        _refused(f"squeezed_weight must be a number from 0 to 1, got {bad!r}", squeezed_weight=bad)
    for ok in (0, 0.0, 0.5, 1, 1.0):
        assert C(squeezed_weight=ok).squeezed_weight == ok


def test_sandbox_weight():
    for bad in (0, 0.0, -0.5, 1.01, True, "0.5", None):
        _refused(
            f"sandbox_weight must be a number above 0 and at most 1, got {bad!r}",
            sandbox_weight=bad,
        )
    for ok in (1e-9, 1 / 16, 1, 1.0):
        assert C(sandbox_weight=ok).sandbox_weight == ok


def test_fork_server_max_crashes():
    for bad in (0, -1, True, 1.0, "2"):
        _refused(
            f"fork_server_max_crashes must be an integer >= 1, got {bad!r}",
            fork_server_max_crashes=bad,
        )
    assert C(fork_server_max_crashes=1).fork_server_max_crashes == 1


@pytest.mark.parametrize("name", ["images_dir", "layers_dir"])
def test_absolute_dirs(name):
    _refused(f"{name} must be an absolute path, got 'rel/x'", **{name: "rel/x"})
    assert getattr(C(**{name: "/abs/x"}), name) == "/abs/x"
    assert getattr(C(**{name: ""}), name) == ""


def test_work_root_absolute():
    _refused("work_root must be an absolute path, got 'rel'", work_root="rel")
    _refused("work_root must be an absolute path, got ''", work_root="")
    assert C(work_root="/w").work_root == "/w"


def test_layer_reservations():
    for bad in (-1, True, 1.0, "2"):
        _refused(
            f"layer_reservations['t1'] must be an integer >= 0 (MiB), got {bad!r}",
            layer_reservations={"ok": 1, "t1": bad},
        )
    assert C(layer_reservations={"a": 0, "b": 5}).layer_reservations == {"a": 0, "b": 5}


@pytest.mark.parametrize("name", ["sandbox_uid", "sandbox_gid"])
def test_sandbox_ids(name):
    for bad in (0, -1, "5", 5.0):
        _refused(f"{name} must be a positive (non-root) id, got {bad!r}", **{name: bad})
    assert getattr(C(**{name: 1}), name) == 1


def test_image_id_count():
    for bad in (0, (1 << 24) + 1, "5", 5.0):
        _refused(f"image_id_count must be an integer in 1..2**24, got {bad!r}", image_id_count=bad)
    assert C(image_id_count=1).image_id_count == 1
    assert C(image_id_count=1 << 24).image_id_count == 16777216


IMG = (
    "image_id_base must be >= 65536, leave room for image_id_count ids below 2**32-2, and "
    "not hold sandbox_uid/gid, got "
)


def test_image_id_base():
    top = (1 << 32) - 2
    for bad, kw in [
        (65535, {}),
        (65536.0, {}),
        (True, {}),
        (top - 65536 + 1, {}),
        (top - 9, {"image_id_count": 10}),
    ]:
        _refused(IMG + repr(bad), image_id_base=bad, **kw)
    assert C(image_id_base=65536, sandbox_id_count=0).image_id_base == 65536
    assert C(image_id_base=top - 65536).image_id_base == top - 65536
    assert C(image_id_base=top - 10, image_id_count=10).image_id_base == top - 10
    b = 1 << 30
    for who in ("sandbox_uid", "sandbox_gid"):
        for v in (b, b + 65535):
            _refused(IMG + repr(b), **{who: v})
        assert getattr(C(**{who: b + 65536}), who) == b + 65536
        assert getattr(C(**{who: b - 1}), who) == b - 1


def test_sandbox_id_count():
    for bad in (-1, (1 << 24) + 1, True, 1.0, "1"):
        _refused(
            f"sandbox_id_count must be an integer in 0..2**24, got {bad!r}", sandbox_id_count=bad
        )
    assert C(sandbox_id_count=0).sandbox_id_count == 0
    assert C(sandbox_id_count=1 << 24).sandbox_id_count == 16777216


SBX = (
    "sandbox_id_base must be >= 65536, leave room for sandbox_id_count ids below 2**32-2, and "
    "hold neither sandbox_uid/gid nor an id of the image range, got "
)


def test_sandbox_id_base():
    top = (1 << 32) - 2
    n = 65536
    img = 1 << 30
    for bad in (65535, 65536.0, True, "x", top - n + 1, img - n + 1, img + n - 1, img):
        _refused(SBX + repr(bad), sandbox_id_base=bad)
    for ok in (65536, top - n, img - n, img + n):
        assert C(sandbox_id_base=ok).sandbox_id_base == ok
    # no per-sandbox ids: the base is not looked at
    assert C(sandbox_id_base=5, sandbox_id_count=0).sandbox_id_base == 5
    b = 1 << 29
    for who in ("sandbox_uid", "sandbox_gid"):
        for v in (b, b + n - 1):
            _refused(SBX + repr(b), **{who: v})
        assert getattr(C(**{who: b + n}), who) == b + n
        assert getattr(C(**{who: b - 1}), who) == b - 1


def test_warm_and_pids():
    _refused("warm_min must be >= 0, got -1", warm_min=-1)
    assert C(warm_min=0, warm_max=0).warm_max == 0
    _refused("warm_max (2) must be >= warm_min (3)", warm_min=3, warm_max=2)
    assert C(warm_min=3, warm_max=3).warm_min == 3
    _refused("pids_max must be >= 16, got 15", pids_max=15)
    assert C(pids_max=16).pids_max == 16


def test_image_cache_dir(monkeypatch, tmp_path):
    assert C(images_dir="/srv/img", work_root=str(tmp_path)).image_cache_dir() == "/srv/img"
    seen = []

    def fs(path, kind="ext4"):
        seen.append(path)
        return kind

    monkeypatch.setattr(layers, "fs_type", fs)
    assert C(work_root="/w/r").image_cache_dir() == "/w/r/images"
    assert seen == ["/w/r"]
    for kind in ("tmpfs", "ramfs"):
        monkeypatch.setattr(layers, "fs_type", lambda p, k=kind: k)
        assert C(work_root="/w/r").image_cache_dir() == "/var/tmp/arl-tangram/images"


def test_image_limits():
    lim = C(
        image_max_mb=3, image_max_files=7, image_max_ratio=9.5, image_min_free_mb=5
    ).image_limits()
    assert (lim.max_bytes, lim.max_files, lim.max_ratio, lim.min_free_bytes) == (
        3 << 20,
        7,
        9.5,
        5 << 20,
    )
    d = C().image_limits()
    assert (d.max_bytes, d.max_files, d.max_ratio, d.min_free_bytes) == (
        16 << 30,
        300000,
        200.0,
        2 << 30,
    )
    assert d.ratio_slack == 64 << 20  # (the rest: ImageLimits' own defaults)


def test_positive_helper_order():
    # the first bad name in the order checked is the one named
    _refused("workdir_max_mb must be a positive number, got 0", workdir_max_mb=0, pids_max=0)
    ns = type("NS", (), {"a": 1, "b": 0, "c": -1})()
    with pytest.raises(ValueError, match=r"^b must be a positive number, got 0$"):
        cfgmod._positive(ns, "a", "b", "c")
