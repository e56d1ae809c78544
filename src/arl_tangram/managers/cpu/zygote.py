"""The fork server: builds the sandbox's view of the system once, then forks sandboxes cheaply.

Run as ``python -m arl_tangram.managers.cpu.zygote FD CONFIG_JSON`` by the manager (as root).
Invariant: the zygote lives in a private mount namespace whose root is a read-only tmpfs holding
read-only, nosuid bind mounts of the system directories (nothing of /root, /home, the project or
the service's files besides toolchains named in the config), a minimal /dev and empty mount
points. Each sandbox is a fork that enters fresh PID, mount, network, IPC and UTS namespaces, so
its start costs a fork and a few mounts, never an interpreter start or an import.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import socket
import sys
import traceback
from typing import Any

from . import _linux, proc, sandbox, wire

_RO = _linux.MS_BIND | _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV
_MASK_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
_MASK_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_NS = (_linux.CLONE_NEWNS | _linux.CLONE_NEWPID | _linux.CLONE_NEWNET | _linux.CLONE_NEWIPC
       | _linux.CLONE_NEWUTS)


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


def build_root(root: str, ro_paths: list[str]) -> None:
    """Make ``root`` the sandbox view: read-only system dirs, masked secrets, minimal /dev."""
    os.makedirs(root, exist_ok=True)
    _linux.mount("tmpfs", root, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=4m,mode=0755")
    for p in sorted(set(ro_paths), key=len):
        if os.path.lexists(p):
            _bind_ro(p, root)
    for f in _MASK_FILES:
        if os.path.isfile(root + f):
            _linux.mount("/dev/null", root + f, None, _linux.MS_BIND)
    for d in _MASK_DIRS:
        if os.path.isdir(root + d):
            _linux.mount("tmpfs", root + d, "tmpfs", _linux.MS_RDONLY, "size=4k,mode=0755")
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


def spawn(cfg: dict[str, Any], keep: set[int]) -> tuple[int, socket.socket]:
    """Fork a sandbox; returns (its init's host pid, our end of its socket)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.close(r)
        _intermediate(cfg, theirs.fileno(), w, keep)
    theirs.close()
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    with contextlib.suppress(ChildProcessError):  # the SIGCHLD handler may get it first
        os.waitpid(pid, 0)
    if not data.isdigit():
        ours.close()
        raise OSError(f"sandbox setup failed: {data.decode(errors='replace')}")
    return int(data), ours


def _intermediate(cfg: dict[str, Any], sock: int, w: int, keep: set[int]) -> None:
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _linux.unshare(_NS)
        g = os.fork()
        if g == 0:
            _init(cfg, sock, w, keep)
        os.write(w, str(g).encode())
    except BaseException as e:
        os.write(w, f"{type(e).__name__}: {e}".encode())
    os._exit(0)


def _init(cfg: dict[str, Any], sock: int, w: int, keep: set[int]) -> None:
    try:
        for fd in keep:
            os.close(fd)
        os.close(w)
        sandbox.become(cfg["workdir_mb"], cfg["uid"], cfg["gid"], cfg["hostname"])
        sandbox.serve(sock)
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _preload(modules: list[str]) -> None:
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def main() -> None:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(sys.argv[2])
    hello: dict[str, Any] = {"ok": True}
    try:
        _linux.prctl(_linux.PR_SET_PDEATHSIG, 9)
        _linux.unshare(_linux.CLONE_NEWNS)
        _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
        build_root(cfg["root"], cfg["ro_paths"])
        _preload(cfg["preload"])
        gc.collect()
        gc.freeze()  # forked children do not touch (copy) the preloaded objects' pages for GC
        enter_root(cfg["root"])
        _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
    except BaseException as e:
        hello = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    ctl.send(wire.encode(hello)[4:])
    if not hello["ok"]:
        os._exit(1)
    _serve(ctl, cfg)


def _serve(ctl: socket.socket, cfg: dict[str, Any]) -> None:
    keep = {ctl.fileno()}
    signal.signal(signal.SIGCHLD, lambda *_: sandbox._reap_all())  # dead sandboxes go at once
    while True:
        try:
            msg = ctl.recv(1 << 16)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        sandbox._reap_all()
        try:
            req = json.loads(msg)
            pid, sock = spawn({**cfg, **req.get("cfg", {})}, keep)
            socket.send_fds(ctl, [json.dumps({"pid": pid}).encode()], [sock.fileno()])
            sock.close()
        except Exception as e:
            ctl.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())


if __name__ == "__main__":
    _ = proc  # imported for the sandbox's use after pivot_root
    main()
