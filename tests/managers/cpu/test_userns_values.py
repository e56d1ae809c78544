"""The node's user namespace for image sandboxes (`managers/cpu/host/userns.py`), read back from
the kernel and asserted exactly (issue 43).

- the maps written: uid_map and gid_map are each ``0 <base> <count>``, one line; inside the
  namespace host ``base`` (the image id range's first) is 0 and ``base + count - 1`` (its last)
  is ``count - 1``, the host ids just outside (``base - 1``, ``base + count``) are unmapped (the
  overflow id 65534), for files' owners and groups alike;
- an idmapped mount through it (`UserNamespace.idmap`): a file the image gave uid/gid 0 is host
  ``base``, ``count - 1`` is ``base + count - 1``, ``count`` is unmapped;
- the namespace's owner (NS_GET_OWNER_UID): the uid asked for, root for -1 and 0; the fd is
  close-on-exec and the helper process is reaped before `make` returns;
- the helper failing: OSError with its own words (bytes not UTF-8 replaced), or "the helper
  died" when it said nothing; the helper's argv and fds (0, 1, 2 only), no pipe left open;
- `describe`: the isolation report's words, exactly.
"""

from __future__ import annotations

import array
import fcntl
import gc
import json
import os
import stat
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _cpu_helpers import TEST_ID_BASE

from arl_tangram.managers.cpu import _linux
from arl_tangram.managers.cpu.host import overlay, userns

BASE, COUNT = 1 << 30, 65536
OVERFLOW = 65534  # what an id with no mapping reads as (/proc/sys/kernel/overflowuid)

pytestmark = pytest.mark.needs_root


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mapping ids needs root")


@pytest.fixture(scope="module")
def ns() -> Iterator[userns.UserNamespace]:
    n = userns.make(BASE, COUNT)
    yield n
    n.close()


def _in_child(fn: Callable[[], object]) -> object:
    """``fn()`` run in a forked child (one thread: as setns into a user namespace and unshare
    want), its JSON result passed back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.write(w, json.dumps(fn()).encode())
            code = 0
        except BaseException as e:  # (reported to the parent)
            os.write(w, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    got = b""
    while chunk := os.read(r, 65536):
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out = json.loads(got)
    assert not (isinstance(out, dict) and "error" in out), out
    return out


def _owned(d: Path, owners: dict[str, int]) -> None:
    for name, i in owners.items():
        (d / name).write_text(name)
        os.chown(d / name, i, i)


def test_the_maps_written_are_base_and_count(ns: userns.UserNamespace) -> None:
    def maps() -> list[str]:
        _linux.setns(ns.fd, _linux.CLONE_NEWUSER)
        return [Path(f"/proc/self/{n}").read_text() for n in ("uid_map", "gid_map")]

    got = _in_child(maps)
    assert [m.split() for m in got] == [["0", str(BASE), str(COUNT)]] * 2
    assert [m.count("\n") for m in got] == [1, 1]
    assert (ns.base, ns.count) == (BASE, COUNT)


def test_inside_ids_of_the_range_first_and_last_and_just_outside(
    ns: userns.UserNamespace, tmp_path: Path
) -> None:
    owners = {"first": BASE, "last": BASE + COUNT - 1, "below": BASE - 1, "above": BASE + COUNT}
    _owned(tmp_path, owners)

    def ids() -> dict[str, list[int]]:
        _linux.setns(ns.fd, _linux.CLONE_NEWUSER)
        out = {n: [os.stat(tmp_path / n).st_uid, os.stat(tmp_path / n).st_gid] for n in owners}
        out["me"] = [os.getuid(), os.getgid()]  # (root of the host: unmapped inside)
        return out

    assert _in_child(ids) == {
        "first": [0, 0],
        "last": [COUNT - 1] * 2,
        "below": [OVERFLOW] * 2,
        "above": [OVERFLOW] * 2,
        "me": [OVERFLOW] * 2,
    }


def test_an_idmapped_mount_shows_the_images_ids_as_the_hosts(
    ns: userns.UserNamespace, tmp_path: Path
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    owners = {"root": 0, "last": COUNT - 1, "out": COUNT, "mid": 1000}
    _owned(src, owners)

    def ids() -> dict[str, list[int]]:
        _linux.unshare(_linux.CLONE_NEWNS)  # (the mount dies with this child)
        _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
        fd = overlay.open_tree_clone(str(src))
        ns.idmap(fd)
        _linux.move_mount(fd, str(dst))
        return {n: [os.stat(dst / n).st_uid, os.stat(dst / n).st_gid] for n in owners}

    assert _in_child(ids) == {
        "root": [BASE] * 2,
        "last": [BASE + COUNT - 1] * 2,
        "out": [OVERFLOW] * 2,
        "mid": [BASE + 1000] * 2,
    }
    assert [os.stat(src / n).st_uid for n in owners] == list(owners.values())  # (unchanged)


def _owner(fd: int) -> int:
    buf = array.array("I", [0])
    fcntl.ioctl(fd, 0xB704, buf)  # NS_GET_OWNER_UID
    return buf[0]


def _children() -> set[str]:
    out: set[str] = set()
    for t in os.listdir("/proc/self/task"):
        out |= set(Path(f"/proc/self/task/{t}/children").read_text().split())
    return out


@pytest.mark.parametrize(
    "owner,want", [(-1, 0), (0, 0), (TEST_ID_BASE + 12301, TEST_ID_BASE + 12301)]
)
def test_owner_fd_and_helper_reaped(owner: int, want: int) -> None:
    before = _children()
    n = userns.make(BASE + 7, 3, owner=owner)
    try:
        assert _children() == before  # the helper is gone (killed and reaped)
        assert _owner(n.fd) == want
        assert fcntl.fcntl(n.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert fcntl.fcntl(n.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        assert stat.S_ISREG(os.fstat(n.fd).st_mode)  # (an nsfs file)
        assert (n.base, n.count) == (BASE + 7, 3)
    finally:
        n.close()
    n.close()  # (twice: no error)


@pytest.mark.parametrize(
    "says,want",
    [
        ("unshare: errno 1", "cannot make a user namespace: unshare: errno 1"),
        ("", "cannot make a user namespace: the helper died"),
        ("\\377 not utf-8", "cannot make a user namespace: \ufffd not utf-8"),  # (replaced)
    ],
)
def test_a_helper_that_fails_is_an_oserror_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, says: str, want: str
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n" + (f"printf '{says}\\n'\n" if says else "") + "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(userns.sys, "executable", str(fake))
    before = _children()
    with pytest.raises(OSError) as e:
        userns.make(BASE, COUNT)
    assert str(e.value) == want
    assert _children() == before


def test_describe_says_the_range_exactly() -> None:
    n = userns.UserNamespace(-1, BASE, COUNT)
    assert n.describe() == (
        f"userns (the image's user, root when unset; ids 0-65535 inside are "
        f"host {BASE}-{BASE + 65535}; idmapped layers)"
    )
    assert n.describe("one per image sandbox") == (
        f"userns (the image's user, root when unset; ids 0-65535 inside are host "
        f"{BASE}-{BASE + 65535}; idmapped layers; one per image sandbox)"
    )
    assert userns.UserNamespace(-1, 5, 1).describe() == (
        "userns (the image's user, root when unset; ids 0-0 inside are host 5-5; idmapped layers)"
    )


def test_idmap_passes_the_mount_and_its_own_fd(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(userns._linux, "idmap_mount", lambda m, u: seen.append((m, u)))
    userns.UserNamespace(41, BASE, COUNT).idmap(17)
    assert seen == [(17, 41)]


def test_the_helper_runs_alone_and_nothing_is_left_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper as the kernel has it while its namespace is opened: ``python -S -c <helper>
    <owner>``, with only its stdin, stdout and stderr (not an inheritable fd of the manager);
    and `make` leaves no pipe of it open (no ResourceWarning)."""
    seen: dict[str, object] = {}
    real = os.open

    def spy(path: str, flags: int, *a: int) -> int:
        if path.endswith("/ns/user"):
            pid = path.split("/")[2]
            seen["argv"] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            seen["fds"] = sorted(int(f) for f in os.listdir(f"/proc/{pid}/fd"))
        return real(path, flags, *a)

    monkeypatch.setattr(userns.os, "open", spy)
    r, w = os.pipe()
    os.set_inheritable(w, True)
    gc.collect()  # (what earlier tests of the suite left unclosed warns now, not in the check)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            n = userns.make(BASE, COUNT, owner=TEST_ID_BASE + 12302)
            n.close()
            del n
            gc.collect()
    finally:
        os.close(r)
        os.close(w)
    assert seen["argv"] == [
        os.fsencode(sys.executable),
        b"-S",
        b"-c",
        userns._HELPER.encode(),
        str(TEST_ID_BASE + 12302).encode(),
    ]
    assert seen["fds"] == [0, 1, 2]
    assert [str(c.message) for c in caught if issubclass(c.category, ResourceWarning)] == []
