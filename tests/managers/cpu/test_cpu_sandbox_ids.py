"""Each sandbox runs as host ids of its own (issue 35, M2): per-uid kernel limits are its own.

The kernel counts inotify instances (`fs.inotify.max_user_instances`, 128 by default) per uid
(on Linux >= 5.11 per (user namespace, uid)). With every sandbox on one uid (65534 by default,
the host's `nobody`), one session holding 128 instances made `inotify_init` fail with EMFILE in
every other sandbox and for the host's own `nobody`. Here a session holds every instance its
uid may have, and another session, a one-shot action and the host's `nobody` still make one;
the ids are pinned (in the node's range, distinct, never 65534), an id comes back to a later
sandbox only once the earlier one's processes are gone (with all its instances free again),
and files a sandbox makes in its work directory and /tmp are its own uid's. Real sandboxes,
the real kernel, a manager with the default id settings."""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_ID_BASE, action, allot, procs_of_uid

from arl_tangram.core.actions import ActionKind
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host import ids

pytestmark = [pytest.mark.integration, pytest.mark.needs_root,
              pytest.mark.asyncio(loop_scope="module")]

with open("/proc/sys/fs/inotify/max_user_instances") as _f:
    MAX_INSTANCES = int(_f.read())
EMFILE = 24

# Hold inotify instances until the kernel refuses one (kept in `held`: a session keeps them).
HOLD = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
held = []
while True:
    fd = libc.inotify_init1(0o2000000)
    if fd < 0:
        err = ctypes.get_errno()
        break
    held.append(fd)
print(json.dumps([len(held), err, os.getuid(), os.getgid()]))
'''
# Make one instance: [ok, errno, uid].
ONE = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0o2000000)
e = ctypes.get_errno()
print(json.dumps([fd >= 0, 0 if fd >= 0 else e, os.getuid()]))
'''


def last_json(r: object) -> list[int]:
    rr = getattr(r, "run_result", None)
    assert rr is not None and rr.return_code == 0, r.to_dict()  # type: ignore[attr-defined]
    return json.loads(rr.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def py(sid: str, code: str) -> object:
    return action(code, kind=ActionKind.TOOL, session=sid, language="python")


def as_nobody(code: str) -> list[int]:
    exe = next(p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK))
    p = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=60,
                       user=65534, group=65534, cwd="/")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)  # type: ignore[no-any-return]


@pytest_asyncio.fixture(scope="module", loop_scope="module",
                        params=[(True, True), (False, True), (True, False)],
                        ids=["compiled", "python", "prepared"])
async def mgr(request: pytest.FixtureRequest) -> AsyncIterator[CpuManager]:
    """A manager with the default ids (and uid settings): only its work root is its own; a
    sandbox's set-up through the compiled path and through Python's, and one-shot Python
    actions in a prepared child (`direct_python` off) instead of the sandbox's PID 1."""
    compiled, direct = request.param
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-ids-"),
                                    warm_min=1, warm_max=2, session_reap_interval_s=0.2,
                                    compiled_setup=compiled, direct_python=direct))
    await m.start()
    yield m
    await m.aclose()


async def test_a_session_holding_every_inotify_instance_takes_none_from_others(
        mgr: CpuManager) -> None:
    assert as_nobody(ONE) == [True, 0, 65534]  # the host's nobody, before
    await mgr.open_session("hold", allot(), ttl_s=120)
    await mgr.open_session("other", allot(), ttl_s=120)
    try:
        held, err, uid, gid = last_json(await mgr.run(py("hold", HOLD), allot()))
        one_shot = last_json(await mgr.run(action(ONE), allot()))
        other = last_json(await mgr.run(py("other", ONE), allot()))
        nobody = as_nobody(ONE)
        # every other sandbox, session and the host's nobody still make an instance
        assert (one_shot[:2], other[:2], nobody) == ([True, 0], [True, 0], [True, 0, 65534])
        # the session got every instance a uid may have, then EMFILE: none was another's
        assert (held, err) == (MAX_INSTANCES, EMFILE)
        # its ids: its own, in the node's range (the default), never nobody, uid == gid
        cfg = mgr.config
        assert (cfg.sandbox_id_base, cfg.sandbox_id_count) == (1 << 29, 65536)
        assert uid == gid and cfg.sandbox_id_base <= uid < cfg.sandbox_id_base + 65536
        assert len({uid, one_shot[2], other[2], 65534}) == 4
        # (the session's instances are still held: its second action finds none free)
        assert last_json(await mgr.run(py("hold", ONE), allot())) == [False, EMFILE, uid]
    finally:
        await mgr.close_session("hold")
        await mgr.close_session("other")


async def test_files_a_sandbox_makes_are_its_own_uids(mgr: CpuManager) -> None:
    code = ("import os\nopen('/tmp/t', 'w').write('a'); open('/workdir/w', 'w').write('b')\n"
            "os.mkdir('/workdir/d'); open('/workdir/d/x', 'w').write('c')\n"
            "print([os.getuid()] + [os.stat(p).st_uid for p in ('/workdir', '/tmp/t', "
            "'/workdir/w', '/workdir/d', '/workdir/d/x')] + [os.stat('/tmp').st_mode & 0o7777])")
    await mgr.open_session("files", allot(), ttl_s=120)
    try:
        got = json.loads((await mgr.run(py("files", code), allot())).run_result.stdout)  # type: ignore[union-attr]
        assert got[1:6] == [got[0]] * 5 and got[6] == 0o1777, got
        # a later action of the session (the same uid) writes them again
        r = await mgr.run(py("files", "open('/tmp/t', 'a').write('z'); "
                                      "open('/workdir/d/x', 'a').write('z'); "
                                      "print(open('/tmp/t').read() + open('/workdir/d/x').read())"),
                          allot())
        assert r.run_result is not None and r.run_result.stdout == "azcz\n", r.to_dict()
    finally:
        await mgr.close_session("files")
    # a one-shot action's files too (the direct path and a forked child)
    for extra in ({}, {"fetch_files": ["w"]}):
        r = await mgr.run(action(code, **extra), allot())
        got = json.loads(r.run_result.stdout)  # type: ignore[union-attr]
        assert got[1:6] == [got[0]] * 5, (extra, got)


async def test_sandboxes_alive_together_run_as_distinct_ids(mgr: CpuManager) -> None:
    code = "import os, time\ntime.sleep(0.3)\nprint(os.getuid(), os.getgid())\n"
    rs = await asyncio.gather(*(mgr.run(action(code, **extra), allot())
                                for extra in ({}, {}, {"fetch_files": ["x"]}, {})))
    got = [tuple(map(int, r.run_result.stdout.split())) for r in rs]  # type: ignore[union-attr]
    b = mgr.config.sandbox_id_base
    assert len({u for u, _ in got}) == 4 and all(u == g and b <= u < b + 65536 for u, g in got)


async def test_an_id_comes_back_only_with_every_instance_of_its_last_sandbox_free() -> None:
    """Four ids, no warm pool: every new sandbox takes the longest-free id; the one that gets
    the held session's id again finds all its instances free (its processes were gone)."""
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-ids4-"),
                                    warm_min=0, warm_max=0, sandbox_id_base=TEST_ID_BASE + 12288,
                                    sandbox_id_count=4, session_reap_interval_s=0.2))
    await m.start()
    try:
        await m.open_session("hold", allot(), ttl_s=120)
        held, _, uid, _ = last_json(await m.run(py("hold", HOLD), allot()))
        assert held == MAX_INSTANCES and TEST_ID_BASE + 12288 <= uid < TEST_ID_BASE + 12292
        await m.close_session("hold")
        seen = []
        for _ in range(8):
            got = last_json(await m.run(action(HOLD), allot()))
            seen.append(got[2])
            if got[2] == uid:
                assert got[:2] == [MAX_INSTANCES, EMFILE], got
                break
        assert uid in seen and set(seen) <= set(range(TEST_ID_BASE + 12288, TEST_ID_BASE + 12292))
        # four sessions hold the four ids: a fifth is refused, naming why; one closed, it opens
        for i in range(4):
            await m.open_session(f"s{i}", allot(), ttl_s=120)
        with pytest.raises(Exception, match="every sandbox id of this manager is in use"):
            await m.open_session("s4", allot(), ttl_s=120)
        await m.close_session("s0")
        for _ in range(100):  # (the id comes back once its sandbox's init is reaped)
            try:
                await m.open_session("s4", allot(), ttl_s=120)
                break
            except Exception:
                await asyncio.sleep(0.05)
        assert m.has_session("s4")
        assert last_json(await m.run(py("s4", ONE), allot()))[:2] == [True, 0]
    finally:
        await m.aclose()
    assert procs_of_uid(TEST_ID_BASE + 12288, 4) == []


async def test_the_range_holds_no_host_user_and_blocks_are_never_shared(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="hold the host's user 'nobody' \\(uid 65534\\)"):
        ids.check_range(65000, 1000)
    with pytest.raises(ValueError, match="sandbox_id_base must be >= 65536"):
        CpuManagerConfig(sandbox_id_base=1 << 30)  # the image range
    with pytest.raises(ValueError, match="sandbox_id_base must be >= 65536"):
        CpuManagerConfig(sandbox_id_base=60000, sandbox_id_count=10000)
    d = str(tmp_path)
    a = ids.claim(TEST_ID_BASE, 8192, d)
    b = ids.claim(TEST_ID_BASE, 8192, d)
    try:
        assert (a.first, a.count, b.first, b.count) == (TEST_ID_BASE, 4096, TEST_ID_BASE + 4096,
                                                         4096)
        with pytest.raises(OSError, match=r"every block of sandbox ids .* is held"):
            ids.claim(TEST_ID_BASE, 8192, d)
    finally:
        a.close()
        b.close()
    ids.claim(TEST_ID_BASE, 8192, d).close()  # a closed manager's block is free again


async def test_a_block_with_processes_left_by_a_killed_manager_is_taken_last(
        tmp_path: object) -> None:
    """A manager killed with -9 releases its block's lock while its frozen sessions' processes
    live on until the next start kills them: a new manager prefers a block without any."""
    d = str(tmp_path)
    left = subprocess.Popen(["sleep", "60"], user=TEST_ID_BASE + 5, group=TEST_ID_BASE + 5)
    try:
        b = ids.claim(TEST_ID_BASE, 8192, d)
        try:
            assert b.first == TEST_ID_BASE + 4096, b
        finally:
            b.close()
    finally:
        left.kill()
        left.wait()
    b = ids.claim(TEST_ID_BASE, 8192, d)
    b.close()
    assert b.first == TEST_ID_BASE


async def test_the_fork_server_lends_each_id_once_and_the_busy_ones_last() -> None:
    """`Namespaces`' ids: FIFO; an id is lent again only after its sandbox's init was reaped;
    those a dead fork server's sandboxes still held at start go last; none left: EAGAIN."""
    from arl_tangram.managers.cpu.zygote.server import Namespaces

    ns = Namespaces(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY), [100, 5], [101, 103])
    try:
        assert list(ns.ids) == [100, 102, 104, 101, 103]
        got = [ns.take_id(7) for _ in range(5)]
        assert got == [100, 102, 104, 101, 103]
        with pytest.raises(OSError, match="every sandbox id of this manager is in use"):
            ns.take_id(7)
        ns.id_of[4242] = 102
        ns.reaped(1)  # (another pid: nothing comes back)
        assert list(ns.ids) == []
        ns.reaped(4242)
        ns.give_id(104)  # a fork that failed: first in line
        assert list(ns.ids) == [104, 102] and ns.id_of == {}
        shared = Namespaces(ns.procfd)
        assert shared.take_id(65534) == 65534 and list(shared.ids) == []
        os.close(shared.home_pid)
        os.close(shared.home_net)
    finally:
        for fd in (ns.procfd, ns.home_pid, ns.home_net):
            os.close(fd)


async def test_a_user_namespace_made_for_an_owner_is_owned_by_it() -> None:
    """`userns.make`'s owner (the manager's start-up check that an unprivileged id may make
    one, as each image sandbox's init does): NS_GET_OWNER_UID reads it back; -1 is root."""
    from arl_tangram.managers.cpu.host import userns

    for owner, want in ((TEST_ID_BASE + 12300, TEST_ID_BASE + 12300), (-1, 0)):
        ns = userns.make(1 << 30, 65536, owner=owner)
        try:
            buf = array.array("I", [0])
            fcntl.ioctl(ns.fd, 0xB704, buf)  # NS_GET_OWNER_UID
            assert buf[0] == want
        finally:
            ns.close()
