"""The first id of a range is in it (issue 43): ``image_id_base`` itself, ``sandbox_id_base``
itself, and the last ids, each read back where the kernel keeps it or refused where it would
be shared.

- the node's user namespace maps inside 0 to host ``image_id_base`` exactly (uid_map/gid_map
  read back from a process in it);
- a sandbox uid/gid, or a sandbox id range, that holds the image range's first (or last) id is
  refused; one just outside it is accepted;
- the host's users and groups and the processes whose uid is the range's first id count as in it.
"""

from __future__ import annotations

import os
import pwd

import pytest

from arl_tangram.managers.cpu import CpuManagerConfig, _linux
from arl_tangram.managers.cpu.host import ids, userns
from arl_tangram.managers.cpu.sandbox import imagebox

BASE, COUNT = 1 << 30, 65536


def _cfg(**kw: object) -> CpuManagerConfig:
    return CpuManagerConfig(**{"image_id_base": BASE, "image_id_count": COUNT,
                               "sandbox_id_base": 1 << 29, "sandbox_id_count": 4096, **kw})


@pytest.mark.parametrize("field", ["sandbox_uid", "sandbox_gid"])
def test_a_sandbox_id_at_either_end_of_the_image_range_is_refused(field: str) -> None:
    for v in (BASE, BASE + COUNT - 1):
        with pytest.raises(ValueError, match="image_id_base must be"):
            _cfg(**{field: v})
    for v in (BASE - 1, BASE + COUNT):
        assert getattr(_cfg(**{field: v}), field) == v


def test_a_sandbox_range_touching_the_image_range_is_refused() -> None:
    for b, n in ((BASE - 4096 + 1, 4096),  # holds BASE, the first image id
                 (BASE, 1),  # is it
                 (BASE + COUNT - 1, 4096)):  # holds the last
        with pytest.raises(ValueError, match="an id of the image range"):
            _cfg(sandbox_id_base=b, sandbox_id_count=n)
    for b, n in ((BASE - 4096, 4096), (BASE + COUNT, 4096)):  # just below, just above
        assert _cfg(sandbox_id_base=b, sandbox_id_count=n).sandbox_id_base == b


def test_a_host_user_whose_id_is_the_first_of_the_range_is_in_it() -> None:
    uid = os.getuid()
    name = pwd.getpwuid(uid).pw_name
    with pytest.raises(ValueError, match=f"hold the host's user '{name}' \\(uid {uid}\\)"):
        ids.check_range(uid, 1)
    with pytest.raises(ValueError, match=f"hold the host's user '{name}'"):
        ids.check_range(uid - 9, 10)  # its last id
    if uid > 0:
        ids.check_range(uid - 10, 10)  # ends just below it: no error from this user
    assert os.getuid() in ids.uids_in_use(os.getuid(), 1)


def _maps(ns_fd: int) -> list[list[str]]:
    """uid_map and gid_map as a process in the namespace ``ns_fd`` reads them."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # (a fresh process: one thread, as setns into a user namespace wants)
        try:
            os.close(r)
            _linux.setns(ns_fd, _linux.CLONE_NEWUSER)
            out = b""
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/self/{name}", "rb") as f:
                    out += f.read()
            os.write(w, out)
        finally:
            os._exit(0)
    os.close(w)
    got = b""
    while chunk := os.read(r, 4096):
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return [line.split() for line in got.decode().splitlines()]


@pytest.mark.needs_root
def test_the_node_namespace_maps_inside_root_to_image_id_base() -> None:
    if os.geteuid() != 0:
        pytest.skip("mapping ids needs root")
    ns = userns.make(BASE, COUNT)
    try:
        assert _maps(ns.fd) == [["0", str(BASE), str(COUNT)]] * 2
        assert (ns.base, ns.count) == (BASE, COUNT)
    finally:
        ns.close()


@pytest.mark.needs_root
def test_an_image_sandboxs_own_namespace_maps_inside_root_to_image_id_base() -> None:
    if os.geteuid() != 0:
        pytest.skip("mapping ids needs root")
    fd = imagebox.own_userns(BASE, COUNT, owner=BASE - 1)
    try:
        assert _maps(fd) == [["0", str(BASE), str(COUNT)]] * 2
    finally:
        os.close(fd)
