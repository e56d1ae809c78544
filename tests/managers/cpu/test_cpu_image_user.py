"""Image sessions run as the image's own user (issue 26): root inside a user namespace that maps
it to an unprivileged host uid, the image's files with the owners it gave them, its OCI config's
User, WorkingDir, Env and Entrypoint/Cmd honoured, and every hostile case of docs/sandbox.md
contained with the attacker root inside. The image is this machine's programs and Python
(`imagekit.host_rootfs`, `add_host_python`) with a root-owned /testbed and /opt/env."""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import action, allot, procs_of_uid
from test_cpu_clone_flags import FLAGS, PROBE
from test_cpu_sandbox_ids import EMFILE, HOLD, MAX_INSTANCES, ONE
from test_cpu_seccomp import SOCKETS_INSIDE, sockets_code

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig, RunResult
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageError
from arl_tangram.managers.cpu.sandbox.session_worker import PIDS_FULL

pytestmark = [pytest.mark.integration, pytest.mark.needs_root,
              pytest.mark.asyncio(loop_scope="module")]

BASE = (1 << 30) + (os.getpid() % 4096) * 65536  # this run's own range: its leftovers findable
COUNT = 65536


def _rootfs(d: str) -> str:
    root = imagekit.host_rootfs(os.path.join(d, "rootfs"))
    assert imagekit.add_host_python(root) is not None, "the image needs this machine's python3"
    import _ctypes  # the hostile probes call the kernel through ctypes: its libffi too

    for lib in subprocess.run(["ldd", _ctypes.__file__], capture_output=True,
                              text=True).stdout.split():
        if lib.startswith("/") and os.path.exists(lib) and not os.path.exists(root + lib):
            os.makedirs(os.path.dirname(root + lib), exist_ok=True)
            shutil.copy2(os.path.realpath(lib), root + lib)
    os.makedirs(root + "/testbed/pkg")
    with open(root + "/testbed/repo.py", "w") as f:
        f.write("x = 1\n")
    os.makedirs(root + "/opt/env/lib")
    for p in (root + "/testbed", root + "/testbed/pkg", root + "/opt", root + "/opt/env",
              root + "/opt/env/lib"):
        os.chmod(p, 0o755)
    os.chmod(root + "/testbed/repo.py", 0o644)
    for top, dirs, files in os.walk(root):  # the image's files are root's (as SWE-bench's)
        for n in dirs + files:
            os.lchown(os.path.join(top, n), 0, 0)
    return root


@pytest.fixture(scope="module")
def layout() -> tuple[str, str]:
    d = tempfile.mkdtemp(prefix="tangram-imguser-")
    return d, imagekit.pack_layer(_rootfs(d), os.path.join(d, "root.tar"))


def _import(m: CpuManager, layout: tuple[str, str], name: str, config: dict[str, object]) -> str:
    assert m.images is not None
    d, tar = layout
    if not m.images.has(name):
        oci = imagekit.write_oci_layout(os.path.join(d, name), [tar], config)
        m.images.import_path(oci, name)
    return name


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mgr() -> AsyncIterator[CpuManager]:
    root = tempfile.mkdtemp(prefix="tangram-imguser-w-")
    m = CpuManager(CpuManagerConfig(work_root=root, warm_min=1, warm_max=4,
                                    image_id_base=BASE, image_id_count=COUNT,
                                    session_reap_interval_s=0.2))
    await m.start()
    yield m
    await m.aclose()


def sh(m: CpuManager, sid: str, code: str, **kw: object):  # type: ignore[no-untyped-def]
    return m.run(action(code, kind=ActionKind.TOOL, session=sid, language="bash", **kw), allot())


def py(m: CpuManager, sid: str, code: str, **kw: object):  # type: ignore[no-untyped-def]
    return m.run(action(code, kind=ActionKind.TOOL, session=sid, language="python", **kw),
                 allot())


def out(r: RunResult) -> str:
    assert r.run_result is not None, r.to_dict()
    return r.run_result.stdout


def host_uids(m: CpuManager, sid: str) -> dict[int, tuple[int, ...]]:
    """Every process of the session's sandbox (its cgroup slot) -> its host uids (r, e, s, fs)."""
    slot = m.sessions.by_id[sid].sandbox.slot
    assert slot is not None
    d = slot.dirs.get("pids") or next(iter(slot.dirs.values()))
    with open(f"{d}/cgroup.procs") as f:
        pids = [int(x) for x in f.read().split()]
    got = {}
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    got[pid] = tuple(int(x) for x in line.split()[1:])
    return got


async def no_leftovers(within_s: float = 3.0, but: int = 0) -> list[int]:
    """Processes of this run's host range still alive (there should be none), but ``but``."""
    left: list[int] = []
    for _ in range(int(within_s / 0.05)):
        left = [p for u in (BASE, BASE + 65534) for p in procs_of_uid(u) if p != but]
        if not left:
            return []
        await asyncio.sleep(0.05)
    return left


async def test_root_inside_edits_root_owned_files_and_is_unprivileged_outside(
        mgr: CpuManager, layout: tuple[str, str]) -> None:
    assert str(mgr.isolation_report()["image_user"]).startswith("userns"), mgr.isolation_report()
    img = _import(mgr, layout, "plain", {})
    await mgr.open_session("root", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        r = await sh(mgr, "root", "id -u; id -g; stat -c '%u %g %a' /testbed /testbed/repo.py "
                                  "/opt/env; cat /proc/self/uid_map; echo y >> /testbed/repo.py "
                                  "&& cat /testbed/repo.py && mkdir /testbed/new /opt/env/x && "
                                  "touch /etc/written && echo made; (sleep 300 &); echo $HOME; pwd")
        assert r.status == "Success", r.to_dict()
        lines = out(r).split("\n")
        assert lines[:5] == ["0", "0", "0 0 755", "0 0 644", "0 0 755"], out(r)
        assert lines[5].split() == ["0", str(BASE), str(COUNT)]
        assert lines[6:10] == ["x = 1", "y", "made", "/root"], r.to_dict()
        assert lines[10] == "/workdir"  # no WorkingDir: the work directory
        uids = host_uids(mgr, "root")
        assert len(uids) >= 3, uids  # the init, the shell, the sleep
        assert all(u == (BASE,) * 4 for u in uids.values()), uids
        assert subprocess.run(["ps", "-o", "uid=", "-p", ",".join(map(str, uids))],
                              capture_output=True, text=True).stdout.split() \
            == [str(BASE)] * len(uids)
        r = await py(mgr, "root", "import os; print(os.getuid(), os.geteuid(), os.getcwd()); "
                                  "open('/testbed/repo.py', 'a').write('z = 3\\n'); "
                                  "os.chown('/testbed/new', 65534, 65534); "
                                  "print(os.stat('/testbed/new').st_uid)")
        assert out(r) == "0 0 /workdir\n65534\n", r.to_dict()
    finally:
        await mgr.close_session("root")
    # the cache's layer is untouched, and still root's on the host's disk
    assert mgr.images is not None
    layer = mgr.images.layer_paths(mgr.images.get(img))[0]
    st = os.stat(os.path.join(layer, "testbed/repo.py"))
    assert (st.st_uid, st.st_gid) == (0, 0)
    with open(os.path.join(layer, "testbed/repo.py")) as f:
        assert f.read() == "x = 1\n"
    assert await no_leftovers() == []


async def test_oci_user_workdir_env_and_shell_are_honoured(mgr: CpuManager,
                                                          layout: tuple[str, str]) -> None:
    img = _import(mgr, layout, "nobody", {"User": "nobody", "WorkingDir": "/testbed/pkg",
                                          "Env": ["FOO=bar baz", "PATH=/opt/env/bin:/usr/bin:/bin"],
                                          "Cmd": ["/bin/sh"]})
    await mgr.open_session("nb", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        r = await sh(mgr, "nb", "id -u; id -g; pwd; echo \"$FOO\"; echo $PATH; echo $HOME; "
                                "echo $0; echo y >> /testbed/repo.py || echo denied")
        lines = out(r).splitlines()
        assert lines == ["65534", "65534", "/testbed/pkg", "bar baz", "/opt/env/bin:/usr/bin:/bin",
                         "/", "/bin/sh", "denied"], r.to_dict()
        uids = host_uids(mgr, "nb")
        init = mgr.sessions.by_id["nb"].sandbox.pid
        assert uids.pop(init) == (BASE,) * 4  # its init: root inside
        assert uids and all(u == (BASE + 65534,) * 4 for u in uids.values()), uids
        r = await py(mgr, "nb", "import os; print(os.getuid(), os.getcwd())")
        assert out(r) == "65534 /testbed/pkg\n", r.to_dict()
    finally:
        await mgr.close_session("nb")
    # a one-shot action in an image: the same user and cwd, its files in /workdir
    img2 = _import(mgr, layout, "numeric", {"User": "1000:1000", "WorkingDir": "/srv/new"})
    r = await mgr.run(action("import os\nprint(os.getuid(), os.getgid(), os.getcwd(), "
                             "os.environ['HOME'], open('/workdir/data.txt').read())",
                             image=img2, files={"data.txt": "aGk="}), allot())
    assert out(r) == "1000 1000 /srv/new / hi\n", r.to_dict()
    # a name the image does not have is refused, saying so
    img3 = _import(mgr, layout, "nosuch", {"User": "nosuch"})
    with pytest.raises(ImageError, match="no user 'nosuch'"):
        await mgr.open_session("ns", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img3)
    assert "ns" not in mgr.sessions.by_id
    assert await no_leftovers() == []


async def _contained(m: CpuManager, sid: str, host: int) -> None:
    await m.close_session(sid)
    assert await no_leftovers(but=host) == [], "processes of the session outlived it"
    ok = await m.run(action("print('still fine')"), allot())
    assert ok.status == "Success" and out(ok) == "still fine\n"


async def test_hostile_cases_as_root_in_an_image_session(mgr: CpuManager,
                                                         layout: tuple[str, str]) -> None:
    img = _import(mgr, layout, "plain", {})
    host = subprocess.Popen(["sleep", "60"], user=BASE, group=BASE)  # same host uid as root inside
    try:
        # fork bomb: the pids cgroup
        await mgr.open_session("h0", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img)
        r = await sh(mgr, "h0", ":(){ :|:& };:; sleep 1; echo survived", run_timeout=5)
        assert r.run_result is not None
        await _contained(mgr, "h0", host.pid)
        # the process limit held by a session's own background jobs: the next action that
        # needs a new session process fails saying so, and the session stays open
        await mgr.open_session("hp", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img)
        r = await py(mgr, "hp", "import subprocess\nkids = []\ntry:\n    while True:\n"
                                "        kids.append(subprocess.Popen(['sleep', '60']))\n"
                                "except OSError as e:\n    print(type(e).__name__, e.errno)\n")
        assert out(r) == "BlockingIOError 11\n", r.to_dict()
        r = await sh(mgr, "hp", "echo never")
        assert r.run_result is not None and r.run_result.status == "Error", r.to_dict()
        assert r.run_result.return_code is None and r.run_result.stdout == ""
        assert r.run_result.stderr == f"could not start the bash session process: {PIDS_FULL}\n"
        assert r.status == "Failed"
        assert r.message == PIDS_FULL and "hp" in mgr.sessions.by_id
        await _contained(mgr, "hp", host.pid)
        # memory bomb: the memory cgroup
        await mgr.open_session("h1", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img,
                               layer_mb=64)
        r = await py(mgr, "h1", "a = []\nwhile True:\n    a.append(bytearray(8 << 20))\n",
                     run_timeout=10)
        assert r.memory_exceeded or (r.run_result and r.run_result.return_code != 0), r.to_dict()
        await _contained(mgr, "h1", host.pid)
        # disk fill: the writable layer's cap (root inside gets no ext4 reserved blocks)
        await mgr.open_session("h2", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img,
                               layer_mb=32)
        r = await sh(mgr, "h2", "dd if=/dev/zero of=/testbed/big bs=1M count=200 2>&1 | "
                                "grep -c 'No space left'; stat -c %s /testbed/big")
        assert out(r).split()[0] == "1", r.to_dict()
        assert int(out(r).split()[1]) <= 32 << 20
        await _contained(mgr, "h2", host.pid)
        # /proc, setuid, mounts, namespaces, host processes, ptrace
        await mgr.open_session("h3", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
        code = f"""
import ctypes, errno, os, shutil, signal, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def try_(what, f):
    try:
        f(); print(what, "OK")
    except OSError as e:
        print(what, "denied", errno.errorcode.get(e.errno, e.errno))
def w(p):
    return lambda: open(p, "w").write("1")
for p in ("/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
          "/proc/1/oom_score_adj"):
    try_("write " + p, w(p))
try_("read /proc/kcore", lambda: open("/proc/kcore", "rb").read(1))
try_("read /proc/1/mem", lambda: open("/proc/1/mem", "rb").read(1))
def sc(name, *a):
    r = getattr(libc, name)(*a)
    if r != 0:
        raise OSError(ctypes.get_errno(), name)
try_("mount", lambda: sc("mount", b"none", b"/mnt", b"tmpfs", 0, None))
try_("unshare", lambda: sc("unshare", 0x10000000))
try_("sethostname", lambda: sc("sethostname", b"x", 1))
try_("ptrace", lambda: sc("ptrace", 16, 1, None, None))
try_("kill host {host.pid}", lambda: os.kill({host.pid}, signal.SIGKILL))
try_("chroot", lambda: os.chroot("/tmp"))
import socket
try_("raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
try_("connect out", lambda: socket.create_connection(("1.1.1.1", 53), timeout=1))
try_("lo down", lambda: sc("ioctl", socket.socket().fileno(), 0x8914,  # SIOCSIFFLAGS
                           ctypes.create_string_buffer(b"lo" + bytes(38))))
shutil.copy("/usr/bin/id", "/tmp/id"); os.chmod("/tmp/id", 0o4755)
print("setuid:", subprocess.run(["/tmp/id", "-u"], capture_output=True, text=True,
                                user=65534).stdout.strip(),
      oct(os.stat("/tmp/id").st_mode & 0o7777))
print("caps:", [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")])
print("nnp:", [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")])
"""
        r = await py(mgr, "h3", code)
        got = out(r)
        assert r.status == "Success", r.run_result.stderr if r.run_result else r.to_dict()
        for what in ("write /proc/sysrq-trigger", "write /proc/sys/kernel/hostname",
                     "write /proc/sys/vm/drop_caches", "write /proc/1/oom_score_adj",
                     "read /proc/kcore", "read /proc/1/mem", "mount", "unshare", "sethostname",
                     "ptrace", f"kill host {host.pid}", "chroot", "raw socket", "connect out",
                     "lo down"):
            assert f"{what} denied" in got, (what, got)
        assert "setuid: 65534 0o4755" in got, got  # nosuid + no_new_privs: the bit does nothing
        assert "nnp: ['1']" in got, got
        assert host.poll() is None  # the host's process of the same uid is untouched
        # a raw clone with a namespace flag: EPERM for root inside as for the sandbox uid
        r = await py(mgr, "h3", f"FLAGS_JSON = {json.dumps(json.dumps(FLAGS))}\n" + PROBE)
        assert r.status == "Success", r.to_dict()
        got = json.loads(out(r).strip().splitlines()[-1])
        assert got.pop("plain") == "child"
        assert got == {name: "EPERM" for name in got}, got
        await sh(mgr, "h3", "kill -9 -1; echo done")  # every process it can name: its own
        assert host.poll() is None
        r = await sh(mgr, "h3", "echo init alive")  # (PID 1 of its namespace: not killed)
        assert out(r) == "init alive\n", r.to_dict()
        await _contained(mgr, "h3", host.pid)
    finally:
        host.kill()
        host.wait()


async def test_unconfined_socket_families_are_eperm_for_root_inside(
        mgr: CpuManager, layout: tuple[str, str]) -> None:
    """AF_VSOCK and AF_ALG (issue 35, M6) are refused to root inside an image session and to a
    one-shot image action, as to the sandbox uid; AF_INET, AF_UNIX and netlink still work."""
    img = _import(mgr, layout, "plain", {})
    code = sockets_code()
    await mgr.open_session("sock", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        r = await py(mgr, "sock", "import os; print(os.getuid())\n" + code)
        assert r.status == "Success", r.to_dict()
        uid, got = out(r).strip().splitlines()[-2:]
        assert uid == "0" and json.loads(got) == SOCKETS_INSIDE, r.to_dict()
    finally:
        await mgr.close_session("sock")
    r = await mgr.run(action(code, image=img), allot())
    assert r.status == "Success", r.to_dict()
    assert json.loads(out(r)) == SOCKETS_INSIDE, r.to_dict()


async def test_an_image_session_holding_every_inotify_instance_takes_none_from_others(
        mgr: CpuManager, layout: tuple[str, str]) -> None:
    """(issue 35, M2) Each image sandbox is in a user namespace of its own, owned by its own
    sandbox id: what it counts per user is charged there, not to the owner of one namespace
    shared by every image sandbox (host root: an image session holding 128 inotify instances
    made `inotify_init` fail in every other image session and for every root process of the
    host, this test's included). The maps are the node's range as before."""
    assert mgr.isolation_report()["image_user"] == (
        f"userns (the image's user, root when unset; ids 0-{COUNT - 1} inside are host "
        f"{BASE}-{BASE + COUNT - 1}; idmapped layers; one namespace per image sandbox, owned "
        "by its own sandbox id)")
    img = _import(mgr, layout, "plain", {})
    await mgr.open_session("ia", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    await mgr.open_session("ib", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        a = json.loads(out(await py(mgr, "ia", HOLD)).strip().splitlines()[-1])
        b = json.loads(out(await py(mgr, "ib", ONE)).strip().splitlines()[-1])
        root = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True)
        plain = await mgr.run(action(ONE), allot())
        assert (b, json.loads(root.stdout)) == ([True, 0, 0], [True, 0, 0]), root.stderr
        assert json.loads(out(plain))[:2] == [True, 0]
        assert a == [MAX_INSTANCES, EMFILE, 0, 0]  # all a uid may have, then EMFILE
        # each session's namespace: its own (inode), owned by its sandbox's own id, the maps
        # the node's range
        owners, inodes = [], []
        for sid in ("ia", "ib"):
            pid = sorted(host_uids(mgr, sid))[-1]
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
            try:
                buf = array.array("I", [0])
                fcntl.ioctl(fd, 0xB704, buf)  # NS_GET_OWNER_UID
                owners.append(buf[0])
                inodes.append(os.fstat(fd).st_ino)
            finally:
                os.close(fd)
            with open(f"/proc/{pid}/uid_map") as f:
                assert f.read().split() == ["0", str(BASE), str(COUNT)]
        assert owners == [mgr.sessions.by_id[s].sandbox.uid for s in ("ia", "ib")]
        b0 = mgr.config.sandbox_id_base
        assert len(set(owners)) == 2 and all(b0 <= o < b0 + mgr.config.sandbox_id_count
                                             for o in owners)
        assert len(set(inodes)) == 2
    finally:
        await mgr.close_session("ia")
        await mgr.close_session("ib")


async def test_without_the_user_namespace_images_run_as_the_sandbox_uid(
        layout: tuple[str, str]) -> None:
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-imguser-off-"),
                                    warm_min=0, warm_max=2, image_userns=False,
                                    sandbox_uid=BASE - 7, sandbox_gid=BASE - 7,
                                    sandbox_id_count=0))  # (one uid: BASE - 7, pinned below)
    await m.start()
    try:
        assert m.isolation_report()["image_user"] == \
            f"sandbox uid {BASE - 7} (image_userns=False)"
        img = _import(m, layout, "plain", {"WorkingDir": "/testbed"})
        await m.open_session("off", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
        r = await sh(m, "off", "id -u; pwd; echo y >> /testbed/repo.py || echo denied")
        assert out(r).split() == [str(BASE - 7), "/testbed", "denied"], r.to_dict()
    finally:
        await m.aclose()
