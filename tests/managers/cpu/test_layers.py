"""Writable layers on the node's disk (`layers.py`), without a manager: made concurrently,
each its own file system of its cap, and gone with their last fd."""

from __future__ import annotations

import os
import tempfile
import threading
import time

import pytest
from _cpu_helpers import layer_loops

from arl_tangram.managers.cpu.images.layers import LayerError, LayerStore

pytestmark = pytest.mark.needs_root


def test_concurrent_takes_each_get_their_own_layer_and_all_go_with_their_fds() -> None:
    d = tempfile.mkdtemp(prefix="tangram-layers-")
    st = LayerStore(d, 16, warm=0)
    assert st.available, st.problem
    got, errs = [], []

    def take() -> None:
        for _ in range(6):
            try:
                got.append(st.take(16))
            except Exception as e:  # any failure fails the test below
                errs.append(e)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errs == [] and len(got) == 24
    assert len(layer_loops(d)) >= 24  # (one more: the probe's ready layer)
    assert st.used_mb == 24 * 16 and os.listdir(d) == []  # nothing on the host names them
    for layer in got:
        layer.close()
        st.give_back(layer.mb)
    st.close()
    deadline = time.monotonic() + 5
    while layer_loops(d) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert layer_loops(d) == {} and st.used_mb == 0
    os.rmdir(d)


def test_bad_sizes_and_a_spent_budget_are_refused_with_the_figures() -> None:
    d = tempfile.mkdtemp(prefix="tangram-layers-")
    st = LayerStore(d, 16, budget_mb=40, warm=0)
    with pytest.raises(LayerError, match="layer_mb must be at least 4, got 2"):
        st.take(2)
    a = st.take(32)
    with pytest.raises(LayerError, match="budget is spent: 32 of 40 MiB held by open layers, 16"):
        st.take(16)
    a.close()
    st.give_back(a.mb)
    st.take(16).close()
    st.close()
    os.rmdir(d)


def test_a_layer_directory_in_memory_is_not_called_disk() -> None:
    from arl_tangram.managers.cpu.images import layers

    shm = tempfile.mkdtemp(prefix="tangram-layers-", dir="/dev/shm")
    assert layers.fs_type(shm) == "tmpfs"
    assert layers.default_dir(shm) == layers.FALLBACK_DIR  # (a tmpfs /tmp: Debian 13, Fedora)
    disk = tempfile.mkdtemp(prefix="tangram-layers-", dir="/var/tmp")
    assert layers.default_dir(disk) == os.path.join(disk, "layers")
    st = LayerStore(shm, 16, warm=0)
    assert not st.available and "is on tmpfs (memory)" in st.problem
    with pytest.raises(LayerError, match=r"no disk layers on this node: .* tmpfs"):
        st.take(16)
    os.rmdir(shm)
    os.rmdir(disk)


def test_the_image_cache_stays_on_disk_where_work_root_is_in_memory() -> None:
    from arl_tangram.managers.cpu import CpuManagerConfig

    shm = tempfile.mkdtemp(prefix="tangram-root-", dir="/dev/shm")
    disk = tempfile.mkdtemp(prefix="tangram-root-", dir="/var/tmp")
    try:
        assert CpuManagerConfig(work_root=shm).image_cache_dir() == "/var/tmp/arl-tangram/images"
        assert CpuManagerConfig(work_root=disk).image_cache_dir() == os.path.join(disk, "images")
        assert CpuManagerConfig(work_root=shm, images_dir="/srv/img").image_cache_dir() == "/srv/img"
    finally:
        os.rmdir(shm)
        os.rmdir(disk)
