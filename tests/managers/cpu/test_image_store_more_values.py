"""More exact values of the node's image cache (`images/store.py`, issue 43): what opening a
cache does with what an import killed part-way left in ``tmp/`` when part of it cannot be
removed (helper-58: the `ImageStore.__init__` mutants the first run left unrun)."""

from __future__ import annotations

import os

import pytest

from arl_tangram.managers.cpu.images.store import ImageStore

pytestmark = pytest.mark.needs_root


def test_opening_a_cache_ignores_what_it_cannot_remove_from_tmp(tmp_path) -> None:
    # rmtree of a plain file or a symlink fails; the cache opens anyway (ignore_errors=True),
    # removes the directories it can, and leaves the rest
    st = ImageStore(str(tmp_path / "c"))
    st._ensure()
    os.makedirs(os.path.join(st.tmp_dir, "half", "deep"))
    with open(os.path.join(st.tmp_dir, "stray"), "w") as f:
        f.write("x")
    os.symlink("half", os.path.join(st.tmp_dir, "link"))
    again = ImageStore(str(tmp_path / "c"))
    assert sorted(os.listdir(again.tmp_dir)) == ["link", "stray"]
    with open(os.path.join(again.tmp_dir, "stray")) as f:
        assert f.read() == "x"
    assert os.readlink(os.path.join(again.tmp_dir, "link")) == "half"
