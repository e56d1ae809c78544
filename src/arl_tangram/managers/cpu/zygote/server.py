"""The fork server: builds the sandbox's view of the system once, then forks sandboxes cheaply.

Run as ``python -P -m arl_tangram.managers.cpu.zygote.server FD`` by the manager (as root), in ``/``;
its configuration comes as the first message on the control socket FD (`_receive_config`).
Invariant: the zygote lives in a private mount namespace whose root is a read-only tmpfs holding
read-only, nosuid bind mounts of the system directories (nothing of /root, /home, the project or
the service's files besides toolchains named in the config), a minimal /dev and empty mount
points. Each sandbox is ONE fork that is PID 1 of a fresh PID namespace and enters fresh mount,
IPC and UTS namespaces and a network namespace lent to it alone (see `Namespaces`), so its start
costs a fork and a few mounts, never an interpreter start, an import or a netns creation.
"""

from __future__ import annotations

import _socket
import collections
import contextlib
import errno
import fcntl
import gc
import importlib
import json
import os
import signal
import socket
import sys
import traceback
import types
from typing import Any

from .. import _linux, wire
from ..sandbox import child, init, prepared, proc
from . import seccomp

_RO = _linux.MS_BIND | _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV
_MASK_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
_MASK_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
_DEVICES = ("null", "zero", "full", "random", "urandom")
RELOCATED = "/.tangram-ro"  # where read-only host paths under /tmp appear inside sandboxes


def sandbox_path(host_path: str) -> str:
    """Where a read-only host path appears inside a sandbox (its /tmp is the sandbox's own)."""
    return RELOCATED + host_path if host_path.startswith("/tmp/") else host_path


def _bind_ro(src: str, root: str) -> None:
    dst = root + src
    if os.path.islink(src) and os.path.dirname(src) == "/":
        os.symlink(os.readlink(src), dst)  # merged /usr: /bin -> usr/bin
        return
    if os.path.lexists(dst):
        return  # already inside an earlier bind
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "w").close()
    _linux.mount(src, dst, None, _linux.MS_BIND | _linux.MS_REC)
    _linux.mount(None, dst, None, _RO)


def build_root(root: str, ro_paths: list[str], hidden: Any = ()) -> None:
    """Make ``root`` the sandbox view: read-only system dirs, masked secrets, minimal /dev.

    Read-only paths under /tmp (e.g. a virtualenv in /tmp) would be hidden by each sandbox's own
    /tmp, so they are bound at `sandbox_path(p)` instead (see languages.py). ``hidden``: host
    paths masked like the secrets (the service's config file when it lies under /etc, say).
    """
    os.makedirs(root, exist_ok=True)
    _linux.mount("tmpfs", root, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=4m,mode=0755")
    for p in sorted(set(ro_paths), key=len):
        if os.path.lexists(p):
            _bind_ro(p, root + sandbox_path(p)[: -len(p)])
    for f in _MASK_FILES:
        if os.path.isfile(root + f):
            _linux.mount("/dev/null", root + f, None, _linux.MS_BIND)
    for d in _MASK_DIRS:
        if os.path.isdir(root + d):
            _linux.mount("tmpfs", root + d, "tmpfs", _linux.MS_RDONLY, "size=4k,mode=0755")
    for h in hidden:  # (only what lies inside the view; the rest is not there anyway)
        inside = root + sandbox_path(h)
        if os.path.isdir(inside) and not os.path.islink(inside):
            _linux.mount("tmpfs", inside, "tmpfs", _linux.MS_RDONLY, "size=4k,mode=0755")
        elif os.path.lexists(inside) and not os.path.islink(inside):
            _linux.mount("/dev/null", inside, None, _linux.MS_BIND)
    dev = root + "/dev"
    os.makedirs(dev)
    _linux.mount("tmpfs", dev, "tmpfs", _linux.MS_NOSUID | _linux.MS_NOEXEC, "size=64k,mode=0755")
    for name in _DEVICES:
        open(f"{dev}/{name}", "w").close()
        _linux.mount(f"/dev/{name}", f"{dev}/{name}", None, _linux.MS_BIND)
        _linux.mount(None, f"{dev}/{name}", None, _linux.MS_BIND | _linux.MS_REMOUNT
                     | _linux.MS_NOSUID | _linux.MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("shm", "/tmp")):
        os.symlink(target, f"{dev}/{name}")
    _linux.mount(None, dev, None, _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID
                 | _linux.MS_NOEXEC)
    for d in ("proc", "tmp", "workdir", "sandbox"):
        os.makedirs(f"{root}/{d}", exist_ok=True)
    _linux.mount(None, root, None, _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID
                 | _linux.MS_NODEV)


def enter_root(root: str) -> None:
    os.chdir(root)
    _linux.pivot_root(".", ".")
    _linux.umount2(".", _linux.MNT_DETACH)
    os.chdir("/")
    relocate_import_paths()


def relocate_import_paths() -> None:
    """Point the import system at where host paths under /tmp appear inside the root.

    A virtualenv or source tree under /tmp (a CI checkout, say) is bound at `sandbox_path`, so
    ``sys.path`` entries and the ``__path__`` of packages already imported from there must follow,
    or a sandbox's ``import pytest`` (not preloaded) finds nothing.
    """
    sys.path[:] = [sandbox_path(p) for p in sys.path]
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__path__", None)
        if isinstance(path, list):
            path[:] = [sandbox_path(p) for p in path]
    sys.path_importer_cache.clear()


class Namespaces:
    """The fork server's own PID namespace and a pool of empty network namespaces.

    A network namespace is made once (unshare + open, ~2 ms of kernel work plus an asynchronous
    teardown later) and then reused *sequentially*: it is lent to one sandbox at a time and comes
    back only when that sandbox's init has been reaped, i.e. when every process of its PID
    namespace is gone (see docs/sandbox.md for why nothing of the previous user persists).
    """

    def __init__(self, procfd: int, ids: list[int] | None = None,
                 busy: list[int] | None = None, held: list[int] | None = None) -> None:
        self.procfd = procfd
        self.home_pid = os.open("self/ns/pid", os.O_RDONLY, dir_fd=procfd)
        self.home_net = os.open("self/ns/net", os.O_RDONLY, dir_fd=procfd)
        self.free: collections.deque[int] = collections.deque()  # FIFO: longest-idle first
        self.lent: dict[int, int] = {}  # sandbox init pid -> netns fd
        self.made = 0
        self.direct: set[int] = set()  # direct sandboxes: their exit status goes to the manager
        # the host ids lent to sandboxes, one each (issue 35, M2; `host/ids.py`): FIFO, and an
        # id comes back only when its sandbox's init is reaped (every process of it gone)
        # (``busy``: ids of a dead fork server's sandboxes that were still there when this
        # one started: lent last, so they have the longest to die; ``held``: ids of sessions
        # that outlived a dead fork server (issue 41), not lent until the manager gives them
        # back, `give_ids`)
        out = set(held or ())
        late = set(busy or ()) - out
        self.ids: collections.deque[int] = collections.deque(
            [i for i in range(ids[0], ids[0] + ids[1]) if i not in late and i not in out]
            + sorted(late) if ids else ())
        self.held = out
        self.per_sandbox = bool(ids)
        self.id_of: dict[int, int] = {}  # sandbox init pid -> its id

    def take_id(self, shared: int) -> int:
        """An id of its own for the next sandbox (``shared``: every sandbox's, without ids)."""
        if not self.per_sandbox:
            return shared
        if not self.ids:
            raise OSError(errno.EAGAIN, "every sandbox id of this manager is in use")
        return self.ids.popleft()

    def give_id(self, uid: int) -> None:
        """An id taken for a sandbox that never came (its fork failed): first in line again."""
        if self.per_sandbox:
            self.ids.appendleft(uid)

    def give_ids(self, uids: list[int]) -> None:
        """Ids held by sessions of a dead fork server (``held``) whose sandboxes are gone now
        (the manager saw their inits end): lent again, last."""
        for u in uids:
            if u in self.held:
                self.held.discard(u)
                self.ids.append(u)

    def take_net(self) -> int:
        if self.free:
            return self.free.popleft()
        _linux.unshare(_linux.CLONE_NEWNET)
        try:
            fd = os.open("thread-self/ns/net", os.O_RDONLY, dir_fd=self.procfd)
        finally:
            _linux.setns(self.home_net, _linux.CLONE_NEWNET)
        self.made += 1
        return fd

    def reaped(self, pid: int) -> None:
        fd = self.lent.pop(pid, None)
        if fd is not None:
            self.free.append(fd)
        uid = self.id_of.pop(pid, None)
        if uid is not None:
            self.ids.append(uid)


Spawned = tuple[int, int, list[int], int]  # (host pid, our socket, our pipe read ends, its uid)
# our socket, theirs, pipes, netns, the slot's `tasks` files (fds), its uid (and gid)
Kit = tuple[int, int, list[tuple[int, int]], int, tuple[int, ...], int]


def spawn(cfg: dict[str, Any], ns: Namespaces, n: int = 1,
          join: list[str] | None = None) -> list[Spawned | Exception]:
    """Fork ``n`` sandbox inits, each PID 1 of a new PID namespace; per sandbox (its host pid,
    our socket, our read ends of its stdout/stderr pipes: only with ``cfg["direct"]``, else
    empty) or the error. Every fork write-protects all of this process's memory, so each page
    it writes between two forks costs a fault: everything is made first, the forks run in a
    tight loop (`_fork_all`), and their bookkeeping comes after. The caller blocks SIGCHLD until
    its replies are out (`_serve`), so no sandbox is reaped before it is lent its namespace.
    ``join``: per sandbox, the name of the cgroup slot its init moves itself into (`_init`)."""
    kits: list[Kit] = []
    out: list[Spawned | Exception] = []
    try:
        for i in range(n):
            kits.append(_kit(cfg, ns, join[i] if join else None))
    except OSError as e:
        out = [e] * (n - len(kits))
    done: list[Spawned | Exception] = []
    try:
        for (ours, _, pipes, net, _, uid), pid in zip(kits, _fork_all(cfg, ns, kits),
                                                      strict=True):
            if isinstance(pid, int):
                ns.lent[pid] = net
                if ns.per_sandbox:
                    ns.id_of[pid] = uid
                if pipes:
                    ns.direct.add(pid)
                done.append((pid, ours, [r for r, _ in pipes], uid))
                continue
            ns.free.appendleft(net)
            ns.give_id(uid)
            os.close(ours)
            for r, _ in pipes:
                os.close(r)
            done.append(pid)
    finally:
        for _, theirs, pipes, _, cg, _ in kits:
            os.close(theirs)
            for _, w in pipes:
                os.close(w)
            for fd in cg:
                os.close(fd)
    return done + out


def _kit(cfg: dict[str, Any], ns: Namespaces, slot: str | None = None) -> Kit:
    """What one sandbox needs: a socket pair, (direct) stdout/stderr pipes, a network namespace
    (plain fds: no `socket.socket` objects, each one more page written after the forks), and
    with ``slot`` that cgroup slot's `tasks` file in each hierarchy (`_init` writes 0 to each)."""
    fds: list[int] = []
    if slot is not None:
        try:
            for d in cfg["cg_dirs"]:
                fds.append(os.open(slot + "/tasks", os.O_WRONLY | os.O_CLOEXEC, dir_fd=d))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
    cg = tuple(fds)
    try:
        uid = ns.take_id(cfg["uid"])
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    a, b = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # (close-on-exec)
    ours, theirs = a.detach(), b.detach()
    pipes = [os.pipe(), os.pipe()] if cfg.get("direct") else []
    for _, w in pipes:  # room for a whole typical output: the manager reads it lazily
        try:  # noqa: SIM105  (no context manager: each object is a fault after a fork)
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
    return ours, theirs, pipes, ns.take_net(), cg, uid


def _fork_all(cfg: dict[str, Any], ns: Namespaces, kits: list[Kit]) -> list[int | Exception]:
    """Fork one sandbox init per kit: its host pid, or the error. Nothing but the forks and
    the namespace switches runs in this loop (see `spawn`)."""
    if child.FAST is not None:  # the same loop, compiled: no Python between two forks; each
        # child also makes `_init`'s set-up there, from arguments made here, before the forks,
        # and a direct sandbox that does not warm also reads its first request (`serve`'s
        # first step; a compact one runs there)
        setups = [(cg, theirs, net, pipes[0][1] if pipes else -1, pipes[1][1] if pipes else -1,
                   cfg["workdir_mb"], uid, uid if ns.per_sandbox else cfg["gid"],
                   cfg["hostname_b"], b"/sandbox", b"/workdir")
                  for _, theirs, pipes, net, cg, uid in kits]
        take = bool(cfg.get("direct")) and not cfg.get("warm_direct")
        got = child.FAST.fork_all(len(kits), ns.home_pid, setups, take)
        if type(got) is not list:  # in a child, set up: its index, or its first request
            _init_serve(cfg, got if type(got) is bytes else None)
        return list(got)
    pids: list[int | Exception] = []
    for _, theirs, pipes, net, cg, uid in kits:
        try:
            _linux.unshare(_linux.CLONE_NEWPID)  # for our next child only
            try:
                pid = os.fork()
                if pid == 0:
                    _init(cfg, theirs, net, pipes, cg, uid, uid if ns.per_sandbox else cfg["gid"])
            finally:
                _linux.setns(ns.home_pid, _linux.CLONE_NEWPID)  # later children: our own again
        except Exception as e:
            pids.append(e)
            continue
        pids.append(pid)
    return pids


def _init(cfg: dict[str, Any], sock: int, net: int, pipes: list[tuple[int, int]],
          cg: tuple[int, ...], uid: int, gid: int) -> None:
    """A new sandbox init's set-up, then its service (never returns). Where the compiled path
    is on, `_fastpath.init_setup` makes the same calls in the same order (run by `fork_all` in
    each child), then `_init_serve` (a sandbox that needs another set-up, e.g. its own root, must
    take this path)."""
    try:
        # Into its cgroup slot first (cgroup v1 `tasks`, 0: this thread, the init's only one):
        # a thread that moves itself does not take the kernel's global threadgroup lock, whose
        # write side waits for an RCU grace period (a move by the manager would). If a move
        # fails the sandbox ends here, before anything could run outside its limits.
        # A sandbox (and, as PID 1, everything in it) dies with the fork server, which dies with
        # the manager: a killed service leaves no warm or running sandbox behind.
        for fd in cg:
            os.write(fd, b"0")
        _linux.die_with_parent()
        _linux.raw_signal.pthread_sigmask(_linux.SIG_SETMASK, ())
        _linux.raw_signal.signal(_linux.SIGCHLD[0], _linux.SIG_DFL)
        _linux.raw_signal.signal(_linux.SIGPIPE, _linux.SIG_IGN)  # (the init's replies)
        _linux.setns(net, _linux.CLONE_NEWNET)
        _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS)
        os.dup2(sock, 3)
        if pipes:  # direct: the write ends of stdout/stderr at fds 4 and 5 (moved up first:
            # either may be 4 or 5 now; no comprehension: a function object is pages written)
            out_w = fcntl.fcntl(pipes[0][1], fcntl.F_DUPFD, 300)
            err_w = fcntl.fcntl(pipes[1][1], fcntl.F_DUPFD, 300)
            os.dup2(out_w, 4)
            os.dup2(err_w, 5)
        os.closerange(6 if pipes else 4, 1 << 16)  # the control socket, namespace fds
        init.become(cfg["workdir_mb"], uid, gid, cfg["hostname"])
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    _init_serve(cfg)


def _init_serve(cfg: dict[str, Any], first: bytes | None = None) -> None:
    """(A sandbox init, set up.) Serve the manager on fd 3 (`init.serve`), ``first`` the
    body of a first request already read; never returns."""
    try:
        if cfg.get("ids"):  # its own ids (`Namespaces.take_id`): those its work dir was given
            st = os.stat(child.WORKDIR)
            cfg["uid"], cfg["gid"] = st.st_uid, st.st_gid
        init.serve(3, cfg, first)
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _compiled() -> Any:
    """The compiled set-up path (`_fastpath`), or None where the extension is not built."""
    try:
        return importlib.import_module(f"{__package__}._fastpath")
    except ImportError:
        return None


def warm_type_cache(hot: tuple[types.ModuleType, ...]) -> frozenset[str]:
    """Look every module attribute that the sandbox's code (``hot``) may read up once, here.

    Most of a sandbox's code runs once per process, unspecialized, so each ``module.name`` it
    reads goes through the interpreter's type-attribute cache (keyed by the module *type* and
    the name). A miss writes the cache entry and the reference counts of two names: copy-on-
    write faults in every sandbox (~20 per action). Filled here, before any fork, they hit.
    Returns the names looked up: those the code of ``hot`` reads that a module it uses has."""
    names: set[str] = set()
    todo = [f.__code__ for m in hot for f in _functions(m)]
    while todo:
        co = todo.pop()
        names.update(co.co_names)
        todo.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
    used = [vars(v) for m in hot for v in vars(m).values() if isinstance(v, types.ModuleType)]
    names = {n for n in names if any(n in d for d in used)}  # (no module __getattr__ runs)
    probe = types.ModuleType("_")  # the key is (module type, name): any module will do
    for n in names:
        getattr(probe, n, None)
    return frozenset(names)


def _functions(m: types.ModuleType) -> list[types.FunctionType]:
    """The functions of module ``m``, its classes' methods included."""
    out = []
    for v in vars(m).values():
        if isinstance(v, types.FunctionType):
            out.append(v)
        elif isinstance(v, type) and v.__module__ == m.__name__:
            out.extend(f for f in vars(v).values() if isinstance(f, types.FunctionType))
    return out


def _preload(modules: list[str]) -> None:
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


BIND_NOW = "LD_BIND_NOW"


def bind_now() -> None:
    """Start this interpreter again with eager symbol binding, unless it already has it.

    With lazy binding (glibc's default) the first call of each library function from libpython
    or an extension module goes through the dynamic linker (``_dl_fixup``), which writes the
    resolved address into that object's GOT: in a fork, a function the fork server never called
    costs the lookup and a copy-on-write fault of a GOT page, in every sandbox. Bound once at
    start, before anything forks, the GOTs are final. Same arguments and file descriptors
    (the control socket is inherited); the variable is dropped from ``os.environ`` in `main`,
    so nothing a sandbox starts inherits it.
    """
    if os.environ.get(BIND_NOW) == "1":
        return
    with contextlib.suppress(OSError):  # (not worth failing the start for)
        _linux.prctl(_linux.PR_SET_PDEATHSIG, 9)  # kept across execve: no window without it
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
                  {**os.environ, BIND_NOW: "1"})


TITLE = b"tangram-sandbox"  # what /proc/PID/cmdline shows for the fork server and sandboxes


def _receive_config(ctl: socket.socket) -> dict[str, Any]:
    """The configuration comes as the first message on the control socket, with an fd of the
    directory that holds the root's mount point (``cfg["root"]`` is a name in it): neither is
    in this process's argv or environment, and no host path of the service is in its memory
    (sandboxes are forks of it: whatever it holds, an action can read)."""
    msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 1 + 16)
    if not fds:
        raise OSError("fork server: no root directory descriptor with the configuration")
    os.fchdir(fds[0])  # the root is built at a path relative to it (`build_root`)
    os.close(fds[0])
    cfg: dict[str, Any] = json.loads(msg)
    # cgroup v1 hierarchies' base directories (`CgroupTree.join_dirs`): sandboxes move themselves
    # into their slots below them (`_init`); every sandbox closes them in its set-up
    cfg["cg_dirs"] = fds[1:]
    return cfg


def _forget_start() -> None:
    """Nothing of how this interpreter was started stays visible to sandboxes: the exec'd
    argument and environment strings (``/proc/self/cmdline``, ``environ``) are overwritten,
    ``sys.orig_argv``/``sys.argv`` name no file, and ``posix.environ`` (the exec'd environment
    as Python saw it at start) is emptied."""
    _linux.scrub_exec_strings(TITLE)
    sys.orig_argv[:] = [TITLE.decode()]
    sys.argv[:] = [TITLE.decode()]
    importlib.import_module("posix").environ.clear()


def main() -> None:
    bound = os.environ.pop(BIND_NOW, None) == "1"
    ctl = socket.socket(fileno=int(sys.argv[1]))
    hello: dict[str, Any] = {"ok": True, "bind_now": bound}
    ns: Namespaces | None = None
    cfg: dict[str, Any] = {}
    try:
        cfg = _receive_config(ctl)
        _forget_start()
        _linux.prctl(_linux.PR_SET_PDEATHSIG, 9)
        _linux.set_name("tangram-zygote")
        os.nice(5)  # making sandboxes yields to running actions (theirs is their cgroup weight)
        _linux.unshare(_linux.CLONE_NEWNS)
        _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
        ns = Namespaces(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY), cfg.get("ids"),
                        cfg.get("ids_busy"), cfg.get("ids_held"))
        build_root(cfg["root"], cfg["ro_paths"], cfg.get("hidden_paths") or ())
        if cfg.get("syscall_filter", True):
            try:
                child.FILTER = seccomp.build_apart()  # (in a child: see there)
                hello["filter"] = list(child.FILTER.denied)
            except OSError as e:
                hello["filter_error"] = str(e)
        cfg["hostname_b"] = cfg["hostname"].encode()
        if cfg.get("compiled_setup", True):
            child.FAST = _compiled()
        if child.FAST is not None:  # what its compact direct path (`direct_take`) needs
            child.FAST.configure(_linux.raw_signal.signal, _linux.CHILD_DEFAULT_SIGNALS,
                                child.code_failed, init.WORKDIR_SLASH.encode(),
                                child.filter_bpf(), init.SANDBOX_DIR.encode())
        hello["compiled_setup"] = child.FAST is not None
        hello["cgroup_join"] = bool(cfg["cg_dirs"])
        if cfg.get("env"):  # the sandboxes' usual environment (nothing of the service's own)
            child.set_base_env(cfg["env"])
        _preload(cfg["preload"])
        if cfg.get("direct"):
            init.rehearse(cfg)
        gc.collect()
        gc.freeze()  # forked children do not touch (copy) the preloaded objects' pages for GC
        if cfg.get("share_code_ptes"):
            _linux.share_file_ptes()
        enter_root(cfg["root"])
        _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
        warm_type_cache((sys.modules[__name__], init, proc, child, _linux, wire, prepared))
    except BaseException as e:
        hello = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    ctl.send(wire.encode(hello)[4:])
    if not hello["ok"] or ns is None:
        os._exit(1)
    _serve(ctl, cfg, ns)


def _reap(ns: Namespaces, ctl: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ns.reaped(pid)
        if pid in ns.direct:  # its PID 1 ran the action: the manager needs its exit status
            ns.direct.discard(pid)
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(OSError):
                ctl.send(b'{"exit":%d,"rc":%d}' % (pid, rc))  # (no encoder: fewer faults)


class _Reaper:
    """The fork server's SIGCHLD handler: `_reap` until no ended child is left, never nested.

    Python runs a handler between two bytecodes, those of a handler already running included:
    1,000 sessions closed in 2 s nested `_reap` in `_reap` until RecursionError ended the fork
    server (issue 40, bench_sessions). A SIGCHLD that comes while it reaps only asks it to go
    round once more (a child that ended before the loop's last `waitpid` was reaped by it)."""

    __slots__ = ("again", "busy", "ctl", "ns")

    def __init__(self, ns: Namespaces, ctl: socket.socket) -> None:
        self.ns, self.ctl = ns, ctl
        self.busy = self.again = False

    def __call__(self, *_: Any) -> None:
        if self.busy:
            self.again = True
            return
        while True:
            self.busy, self.again = True, False
            try:
                _reap(self.ns, self.ctl)
            finally:
                self.busy = False
            if not self.again:
                return


# The fork server's SIGCHLD handler (`_serve`), also held here: a sandbox that resets SIGCHLD
# (`child.default_signals`) then only drops a reference to it, instead of freeing the object
# (a few copy-on-write page faults in every sandbox).
_on_sigchld: Any = None


def _serve(ctl: socket.socket, cfg: dict[str, Any], ns: Namespaces) -> None:
    global _on_sigchld
    _on_sigchld = _Reaper(ns, ctl)
    signal.signal(signal.SIGCHLD, _on_sigchld)  # dead sandboxes go (and lend) at once
    sig = _linux.raw_signal
    while True:
        try:
            msg = ctl.recv(1 << 16)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        if msg.startswith(b'{"op":"ids"'):  # held ids given back (`Namespaces.give_ids`): no reply
            with contextlib.suppress(ValueError, TypeError):
                ns.give_ids([int(u) for u in json.loads(msg)["free"]])
            continue
        # SIGCHLD waits until the replies are out: a sandbox's exit report (`_reap`) must never
        # come before its spawn reply, and `reaped()` must see `lent[pid]`.
        sig.pthread_sigmask(_linux.SIG_BLOCK, _linux.SIGCHLD)
        n = 1
        try:
            req = json.loads(msg)
            n = max(1, min(64, int(req.get("n", 1))))  # (the manager asks for at most 64)
            join = req.get("join")
            if join is not None and not (cfg["cg_dirs"] and len(join) == n and all(
                    isinstance(j, str) and j[:1] == "s" and j[1:].isdigit() for j in join)):
                raise ValueError(f"bad join: {join!r}")
            got = spawn({**cfg, **req.get("cfg", {})}, ns, n, join)
        except Exception as e:
            got = [e] * n  # one reply per sandbox asked for, whatever happened
        try:
            for r in got:
                _reply(ctl, r)
        except OSError:
            os._exit(0)  # the manager is gone
        finally:
            sig.pthread_sigmask(_linux.SIG_UNBLOCK, _linux.SIGCHLD)


def _reply(ctl: socket.socket, r: Spawned | Exception) -> None:
    if isinstance(r, Exception):
        ctl.send(json.dumps({"error": f"{type(r).__name__}: {r}"}).encode())
        return
    pid, sock, outs, uid = r
    try:
        socket.send_fds(ctl, [b'{"pid":%d,"uid":%d}' % (pid, uid)], [sock, *outs])
    finally:
        os.close(sock)
        for fd in outs:
            os.close(fd)


if __name__ == "__main__":
    _ = proc  # imported for the sandbox's use after pivot_root
    bind_now()
    main()
