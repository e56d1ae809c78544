"""Inside a sandbox: entering an environment image (issue 17), and the image's Python worker.

Invariant: only the sandbox's init (root of its own namespaces, running our code) calls `enter`,
before any action's code runs in the sandbox. It receives the cache's ``layers`` directory
(O_PATH) right after the request frame, and with it the session's writable layer: a detached
mount of an ext4 of the layer's size on the node's disk (`layers.py`), moved in here, or where
the node has none, a size-capped tmpfs it mounts itself. It stacks the image's layers
read-only under it with overlayfs (nosuid, nodev), adds /proc (the sandbox's own PID
namespace) and the sandbox's minimal /dev, and pivots into it: the old root (the host's system
directories, the cache) is detached, and the fds are closed,
so nothing of the host but what every sandbox sees (the kernel's /proc files) is reachable.
Everything else stays as for every sandbox: the action's processes drop to their uid with
no_new_privs and the syscall filter (`child.setup`), in the same namespaces and cgroups.

With the node's user namespace (issue 26; the manager lends its fd last, and the layers fd is
then idmapped through it, `host/userns.py`) the init, once the image is mounted and pivoted
into, joins that namespace as its root (host uid ``base``, no capability over the host: every
namespace of the sandbox belongs to the host's): from then on the init and everything it forks
are host uids of the node's range. It resolves the image's ``User`` in the image's own
/etc/passwd and /etc/group (read as inside root), and the action's processes drop to that user
instead of the sandbox uid. The image's ``WorkingDir`` becomes the cwd of every child (`child.CWD`), and a
shell named by its ``Entrypoint``/``Cmd`` the shell of a bash session (`SHELL`).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import time
from typing import Any

from .. import _linux
from . import child

LAYER_DIR = "/sandbox/layer"  # the writable layer (upper + overlay work dir)
ROOT_DIR = "/sandbox/root"  # where the image is mounted before the pivot
# python3 of the image (after those on its Env PATH): its session worker and one-shot runs
PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3")
python: str | None = None  # set once the sandbox is in an image (`enter`)
# a bash session's shell: the image's Entrypoint + Cmd where they start a shell (`shell_argv`)
SHELL: list[str] | None = None
SHELLS = frozenset(("bash", "sh", "dash", "zsh", "ash", "ksh", "mksh"))


def _recv_fds(fd: int, n: int) -> list[int]:
    s = socket.socket(fileno=os.dup(fd))
    try:
        s.setblocking(True)
        _msg, fds, _flags, _addr = socket.recv_fds(s, 1, 3)
    finally:
        s.close()
    for x in fds:
        os.set_inheritable(x, False)
    if len(fds) != n:
        for x in fds:
            os.close(x)
        raise OSError(f"image: expected {n} fds (the layers directory, the writable layer, "
                      f"the user namespace), got {len(fds)}")
    return fds


def _read_small(path: str, cap: int = 1 << 20) -> str:
    """A regular file of the image (not a FIFO, device or link out of it: the image's own root
    by now), at most ``cap`` bytes; "" when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, cap).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _entries(text: str) -> list[list[str]]:
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def resolve_user(spec: str, passwd: str, group: str) -> tuple[int, int, str]:
    """(uid, gid, home) of an OCI ``User`` (``user``, ``uid``, ``user:group``, ``uid:gid``;
    empty: root) in the image's /etc/passwd and /etc/group texts, as Docker resolves it: a
    name must be there, a number need not (its gid is then the passwd entry's, or 0, and its
    home ``/``). ValueError names what is not found."""
    user, _, grp = (spec or "").partition(":")
    user = user or "root"
    pw = _entries(passwd)
    ent = next((e for e in pw if len(e) >= 7 and e[0] == user), None)
    if ent is None and user.isdigit():
        ent = next((e for e in pw if len(e) >= 7 and e[2] == user), None)
    if ent is not None and ent[2].isdigit() and ent[3].isdigit():
        uid, gid, home = int(ent[2]), int(ent[3]), ent[5] or "/"
    elif user.isdigit():
        uid, gid, home = int(user), 0, "/"
    elif user == "root":  # (an image without /etc/passwd)
        uid, gid, home = 0, 0, "/root"
    else:
        raise ValueError(f"User {spec!r}: no user {user!r} in the image's /etc/passwd")
    if grp:
        if grp.isdigit():
            gid = int(grp)
        else:
            g = next((e for e in _entries(group) if len(e) >= 3 and e[0] == grp), None)
            if g is None or not g[2].isdigit():
                raise ValueError(f"User {spec!r}: no group {grp!r} in the image's /etc/group")
            gid = int(g[2])
    return uid, gid, home


def _on_path(config: dict[str, Any]) -> list[str]:
    """``python3`` in each directory of the image's own ``PATH`` (its ``Env``), first to last:
    the interpreter a shell of the image would run (a virtual environment's, say)."""
    for kv in config.get("Env") or ():
        k, _, v = str(kv).partition("=")
        if k == "PATH":
            return [os.path.join(d, "python3") for d in v.split(":") if d.startswith("/")]
    return []


def shell_argv(config: dict[str, Any]) -> list[str] | None:
    """The image's ``Entrypoint`` + ``Cmd`` when the program they end up running is a shell
    reading its commands (``["/bin/bash"]``, ``["sh"]``, an entrypoint script given ``bash``
    as its command; not ``sh -c ...`` or a script): a bash session runs that as its shell.
    None: the default (/bin/bash)."""
    ep = [str(a) for a in config.get("Entrypoint") or ()]
    cmd = [str(a) for a in config.get("Cmd") or ()]
    argv = ep + cmd
    prog = cmd if cmd else ep
    if not prog or os.path.basename(prog[0]) not in SHELLS:
        return None
    if any(a == "-c" or not a.startswith("-") for a in prog[1:]):
        return None  # a command or a script, not a shell reading commands
    return argv


def own_userns(base: int, count: int, owner: int) -> int:
    """(The init, host root.) A new user namespace mapping ids 0..count-1 to the host's
    base..base+count-1, owned by host uid ``owner``: an fd of it. A child of ours, as
    ``owner``, unshares it and waits; we write its maps (root of the parent namespace may map
    any ids) and open it; the child then exits (the namespace lives on in the fd).

    Why its own (issue 35, M2): the kernel charges what a process counts per user (inotify
    instances and watches, RLIMIT_NPROC, ...) to (its namespace, its uid) and then to (the
    parent namespace, the namespace's owner), where the host's limits apply. In the node's one
    namespace, owned by root, every image sandbox was charged to host root: one session holding
    128 inotify instances broke `inotify_init` for every other image session and every root
    process of the host."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # (never returns)
        ok = b"-"
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgroups([])
            os.setresgid(owner, owner, owner)
            os.setresuid(owner, owner, owner)
            _linux.unshare(_linux.CLONE_NEWUSER)
            ok = b"k"
        except BaseException:
            pass
        try:
            os.write(ready_w, ok)
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"k":
            raise OSError(errno.EPERM, "cannot make the sandbox's user namespace")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 {base} {count}\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def enter(req: dict[str, Any], fd: int) -> dict[str, Any]:
    """Mount the image's layers (``req["layers"]``: names under the received directory, top
    first) with a writable layer of ``req["layer_mb"]`` MiB and pivot into it; with
    ``req["userns"]`` (``{"base", "count"}``: the node's user namespace, its fd lent last) run
    as the image's user (``req["config"]["User"]``) in it from then on (see the module's
    docstring)."""
    global python, SHELL
    t0 = time.perf_counter()
    on_disk = req.get("layer") == "disk"
    ns = req.get("userns")
    owner: int | None = ns.get("owner") if ns else None  # a namespace of its own, made here
    own = owner is not None
    fds = _recv_fds(fd, (2 if on_disk else 1) + (1 if ns and not own else 0))
    ns_fd = fds.pop() if ns and not own else -1
    layers_fd = fds[0]
    try:
        try:
            uid, gid = int(req["uid"]), int(req["gid"])
            base, count = (int(ns["base"]), int(ns["count"])) if ns else (0, 0)
            if own:
                ns_fd = own_userns(base, count, int(owner or 0))
                _linux.idmap_mount(layers_fd, ns_fd)
            for name in req["layers"]:
                if "/" in name or ":" in name or "," in name or name.startswith("."):
                    raise ValueError(f"bad layer name {name!r}")
            nosuid = _linux.MS_NOSUID | _linux.MS_NODEV
            os.mkdir(LAYER_DIR, 0o700)
            if on_disk:  # the manager's detached ext4 of the layer's size (`layers.py`)
                _linux.move_mount(fds[1], LAYER_DIR)
                os.chmod(LAYER_DIR, 0o700)
            else:
                _linux.mount("tmpfs", LAYER_DIR, "tmpfs", nosuid,
                             f"size={int(req['layer_mb'])}m,mode=0700")
            os.mkdir(LAYER_DIR + "/upper", 0o755)
            if ns:  # the overlay's root directory is the upper's: root's, inside
                os.chown(LAYER_DIR + "/upper", base, base)
            os.mkdir(LAYER_DIR + "/work", 0o700)
            os.mkdir(ROOT_DIR, 0o755)
            os.fchdir(layers_fd)  # lower directories are named relative to it
            _linux.mount("overlay", ROOT_DIR, "overlay", nosuid,
                         "lowerdir=" + ":".join(req["layers"]) + f",upperdir={LAYER_DIR}/upper,"
                         f"workdir={LAYER_DIR}/work")
        finally:
            os.chdir("/")
            for x in fds:
                os.close(x)
        r = ROOT_DIR
        for d, mode in (("proc", 0o555), ("dev", 0o755), ("tmp", 0o1777)):
            if not os.path.isdir(f"{r}/{d}") or os.path.islink(f"{r}/{d}"):
                if os.path.lexists(f"{r}/{d}"):
                    os.unlink(f"{r}/{d}")
                os.mkdir(f"{r}/{d}", mode)
                os.chmod(f"{r}/{d}", mode)
                if ns:
                    os.chown(f"{r}/{d}", base, base)
        _linux.mount("proc", f"{r}/proc", "proc", nosuid | _linux.MS_NOEXEC)
        _linux.mount("/dev", f"{r}/dev", None, _linux.MS_BIND | _linux.MS_REC)
        os.chdir(r)
        _linux.pivot_root(".", ".")
        _linux.umount2(".", _linux.MNT_DETACH)
        os.chdir("/")  # from here on, every path is the image's
        home, config = None, req.get("config") or {}
        if ns:  # root of the node's user namespace, and nothing of the host's from now on
            _linux.setns(ns_fd, _linux.CLONE_NEWUSER)
            os.setgroups([])
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
            _linux.die_with_parent()  # (cleared by the uid change)
            # inside root may signal this PID 1 now: only a handler's signal would reach it
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            # read as inside root (a link of the image's to a host root's file: not readable)
            user = str(config.get("User") or "")
            uid, gid, home = resolve_user(user, _read_small("/etc/passwd"),
                                          _read_small("/etc/group"))
            if not (0 <= uid < count and 0 <= gid < count):
                raise ValueError(f"User {user!r}: ids {uid}:{gid} are outside the node's "
                                 f"range of {count}")
        wd = child.WORKDIR
        if os.path.islink(wd) or (os.path.lexists(wd) and not os.path.isdir(wd)):
            os.unlink(wd)
        if not os.path.isdir(wd):
            os.mkdir(wd, 0o755)
        os.chown(wd, uid, gid)  # (the top directory only: a metadata copy-up)
    finally:
        if ns_fd >= 0:
            os.close(ns_fd)
    cwd = str(config.get("WorkingDir") or "")
    cwd = os.path.normpath(os.path.join("/", cwd)) if cwd else wd
    if cwd != wd:
        try:
            os.makedirs(cwd, 0o755, exist_ok=True)  # (created as Docker does: root's, inside)
            os.stat(cwd + "/.")
        except OSError:
            cwd = wd
    child.CWD = cwd
    SHELL = shell_argv(config)
    python = next((p for p in (*_on_path(config), *PYTHONS) if os.access(p, os.X_OK)), None)
    return {"ok": True, "enter_s": round(time.perf_counter() - t0, 6), "python": python,
            "uid": uid, "gid": gid, "home": home, "cwd": cwd, "shell": SHELL,
            "userns": bool(ns)}


# The image's persistent Python worker: the same protocol as `session_worker._python_loop`
# (a frame {"code"} on fd 3, with "cpus" and "env" where the action's cores changed, {"rc"} back
# on fd 4, 4-byte big-endian length + JSON), run by the image's own python3 (the sandbox init's
# interpreter is the host's, whose files are not there).
PYTHON_LOOP = r"""
import ast, builtins, json, os, sys, traceback
def _rd(n):
    b = b""
    while len(b) < n:
        c = os.read(3, n - len(b))
        if not c:
            os._exit(0)
        b += c
    return b
g = {"__name__": "__main__", "__builtins__": builtins}
sys.path[0:1] = [os.getcwd()]
while True:
    req = json.loads(_rd(int.from_bytes(_rd(4), "big")))
    if "cpus" in req:
        os.cpu_count = (lambda n: lambda: n)(int(req["cpus"]))
        os.environ.update(req["env"])
    rc = 0
    try:
        tree = ast.parse(req["code"], "<session>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<session>", "exec"), g)
        if last is not None:
            v = eval(compile(ast.Expression(last.value), "<session>", "eval"), g)
            if v is not None:
                print(repr(v))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        rc = 1
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    body = json.dumps({"rc": rc}).encode()
    os.write(4, len(body).to_bytes(4, "big") + body)
"""
