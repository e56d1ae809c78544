"""The host ids of sandboxes (`managers/cpu/host/ids.py`), their values asserted exactly (issue 43).

- `check_range`: a host user or group whose id is the range's first or last is in it, one just
  outside is not; the message names the range, the user (else group), its id, and the fix;
- `claim`: the lock directory (mode 0700) and each block's lock file (``<first>-<size>``, mode
  0600, opened read-write and close-on-exec, held by an exclusive flock); blocks of
  `SANDBOX_ID_BLOCK` ids (fewer when the range is smaller), only whole blocks; a block with a
  process of its ids is taken only when every free one has some (then the last tried), and the
  blocks tried and not taken are unlocked; every block held: EBUSY with its message;
- `uids_in_use`: the *real* uid of each process, the range's first and last id in it, the ids
  just outside not.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from _cpu_helpers import TEST_ID_BASE

from arl_tangram.managers.cpu.host import ids

B = TEST_ID_BASE  # this run's private ids (nothing else of the host has them)


def _users(
    monkeypatch: pytest.MonkeyPatch, users: list[tuple[str, int]], groups: list[tuple[str, int]]
) -> None:
    monkeypatch.setattr(
        ids.pwd, "getpwall", lambda: [SimpleNamespace(pw_name=n, pw_uid=u) for n, u in users]
    )
    monkeypatch.setattr(
        ids.grp, "getgrall", lambda: [SimpleNamespace(gr_name=n, gr_gid=g) for n, g in groups]
    )


def test_block_size_and_lock_dir() -> None:
    assert ids.SANDBOX_ID_BLOCK == 4096
    assert ids.LOCK_DIR == "/run/arl-tangram/sandbox-ids"


@pytest.mark.parametrize("uid", [1000, 1009])
def test_a_host_user_at_either_end_of_the_range_is_in_it(
    monkeypatch: pytest.MonkeyPatch, uid: int
) -> None:
    _users(monkeypatch, [("a", 999), ("u", uid), ("b", 1010)], [("g", 1005)])
    with pytest.raises(ValueError) as e:
        ids.check_range(1000, 10)
    assert str(e.value) == (
        f"sandbox ids 1000-1009 hold the host's user 'u' (uid {uid}): move sandbox_id_base"
    )


@pytest.mark.parametrize("gid", [1000, 1009])
def test_a_host_group_at_either_end_of_the_range_is_in_it(
    monkeypatch: pytest.MonkeyPatch, gid: int
) -> None:
    _users(monkeypatch, [("a", 999), ("b", 1010)], [("x", 999), ("g", gid), ("y", 1010)])
    with pytest.raises(ValueError) as e:
        ids.check_range(1000, 10)
    assert str(e.value) == (
        f"sandbox ids 1000-1009 hold the host's group 'g' (gid {gid}): move sandbox_id_base"
    )


def test_ids_just_outside_the_range_are_not_in_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _users(monkeypatch, [("a", 999), ("b", 1010)], [("x", 999), ("y", 1010)])
    assert ids.check_range(1000, 10) is None
    _users(monkeypatch, [("a", 1000)], [])
    assert ids.check_range(1000, 0) is None  # an empty range holds nothing


def _fake_in_use(monkeypatch: pytest.MonkeyPatch, base: int, count: int, busy: set[int]) -> None:
    def fake(b: int, c: int) -> set[int]:
        assert (b, c) == (base, count)
        return set(busy)

    monkeypatch.setattr(ids, "uids_in_use", fake)


def _locked(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_claim_makes_its_lock_dir_and_file_with_exact_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _users(monkeypatch, [], [])
    _fake_in_use(monkeypatch, B, 8192, set())
    d = tmp_path / "locks" / "ids"
    old = os.umask(0)  # (the modes asked for, not the umask's)
    try:
        b = ids.claim(B, 8192, str(d))
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        assert sorted(os.listdir(d)) == [f"{B}-4096"]  # the first block was free and clean
        f = d / f"{B}-4096"
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
        assert (b.first, b.count) == (B, 4096)
        assert os.fstat(b.fd).st_ino == os.stat(f).st_ino
        assert fcntl.fcntl(b.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
        assert fcntl.fcntl(b.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert _locked(f)
    finally:
        b.close()
    assert not _locked(f)  # closing the block unlocks it
    b.close()  # (twice: no error)


def test_claim_checks_the_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _users(monkeypatch, [("u", B + 8191)], [])
    with pytest.raises(ValueError, match=f"sandbox ids {B}-{B + 8191} hold the host's user"):
        ids.claim(B, 8192, str(tmp_path))


def test_a_range_smaller_than_a_block_is_one_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _users(monkeypatch, [], [])
    _fake_in_use(monkeypatch, B, 100, set())
    b = ids.claim(B, 100, str(tmp_path))
    try:
        assert (b.first, b.count) == (B, 100)
        assert os.listdir(tmp_path) == [f"{B}-100"]
        with pytest.raises(OSError) as e:
            ids.claim(B, 100, str(tmp_path))
        assert e.value.errno == errno.EBUSY
        assert e.value.strerror == (
            f"every block of sandbox ids {B}-{B + 99} is held by another "
            "CPU manager of this node: widen sandbox_id_count"
        )
    finally:
        b.close()


def test_only_whole_blocks_are_handed_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _users(monkeypatch, [], [])
    _fake_in_use(monkeypatch, B, 3 * 4096 - 1, set())
    got = [ids.claim(B, 3 * 4096 - 1, str(tmp_path)) for _ in range(2)]
    try:
        assert [(b.first, b.count) for b in got] == [(B, 4096), (B + 4096, 4096)]
        with pytest.raises(OSError) as e:  # the 4095 ids left are no block
            ids.claim(B, 3 * 4096 - 1, str(tmp_path))
        assert e.value.errno == errno.EBUSY
        assert sorted(os.listdir(tmp_path)) == [f"{B}-4096", f"{B + 4096}-4096"]
    finally:
        for b in got:
            b.close()


@pytest.mark.parametrize(
    "busy,first",
    [
        ({B}, B + 4096),  # the first block's first id is busy: the second is clean
        ({B + 4095}, B + 4096),  # its last id
        ({B + 4096}, B),  # the second's first: the first is clean
        ({B - 1, B + 8192}, B),  # ids outside the blocks
        ({B + 1, B + 4097, B + 8193}, B + 8192),  # every block busy: the last tried
    ],
)
def test_a_clean_block_is_taken_first_and_the_others_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy: set[int], first: int
) -> None:
    _users(monkeypatch, [], [])
    _fake_in_use(monkeypatch, B, 3 * 4096, busy)
    b = ids.claim(B, 3 * 4096, str(tmp_path))
    try:
        assert (b.first, b.count) == (first, 4096)
        for name in os.listdir(tmp_path):  # only the block taken stays locked
            assert _locked(tmp_path / name) == (name == f"{first}-4096"), name
    finally:
        b.close()


def test_a_block_another_holds_is_skipped_and_its_lock_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _users(monkeypatch, [], [])
    _fake_in_use(monkeypatch, B, 8192, {B + 4096})
    a = ids.claim(B, 8192, str(tmp_path))  # the clean first block
    try:
        b = ids.claim(B, 8192, str(tmp_path))  # the busy second: the only one left
        try:
            assert (a.first, b.first) == (B, B + 4096)
            assert _locked(tmp_path / f"{B}-4096") and _locked(tmp_path / f"{B + 4096}-4096")
        finally:
            b.close()
        assert _locked(tmp_path / f"{B}-4096")
    finally:
        a.close()


def _as(real: int, effective: int) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-c",
            "import os, sys\n"
            f"os.setresgid({real}, {real}, {real})\n"
            f"os.setresuid({real}, {effective}, {effective})\n"
            "sys.stdout.write('ok\\n'); sys.stdout.flush(); sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stdout.readline() == b"ok\n"
    return p


@pytest.mark.needs_root
def test_uids_in_use_are_real_uids_in_the_range() -> None:
    if os.geteuid() != 0:
        pytest.skip("running as other uids needs root")
    u = B + 16000
    procs = [_as(u, u + 100), _as(u + 5, u + 5)]
    try:
        assert ids.uids_in_use(u, 1) == {u}
        assert ids.uids_in_use(u, 6) == {u, u + 5}  # first and last of the range
        assert ids.uids_in_use(u + 1, 5) == {u + 5}
        assert ids.uids_in_use(u - 5, 5) == set()  # ends just below
        assert ids.uids_in_use(u + 1, 4) == set()  # ends just below the second
        assert ids.uids_in_use(u + 6, 1000) == set()  # the effective uid u + 100 is not real
        assert ids.uids_in_use(u, 0) == set()
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.wait()
            assert p.stdout is not None
            p.stdout.close()


@pytest.mark.needs_root
def test_a_process_gone_before_its_status_is_read_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("running as other uids needs root")
    u = B + 16010
    p = _as(u, u)
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()  # (its pid: no process now)
        listed = [str(gone.pid), "self", str(p.pid)]
        monkeypatch.setattr(ids.os, "listdir", lambda d: listed if d == "/proc" else [])
        assert ids.uids_in_use(u, 1) == {u}  # the scan goes on past the one gone
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


def test_a_lock_that_fails_otherwise_is_raised_and_its_fd_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _users(monkeypatch, [], [])
    _fake_in_use(monkeypatch, B, 8192, set())
    (tmp_path / "x").mkdir()  # (the lock dir made before the fds are counted)

    def flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(ids.fcntl, "flock", flock)
    fds = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        ids.claim(B, 8192, str(tmp_path / "x"))
    assert type(e.value) is OSError and e.value.errno == errno.ENOLCK
    assert sorted(os.listdir("/proc/self/fd")) == fds  # nothing left open
