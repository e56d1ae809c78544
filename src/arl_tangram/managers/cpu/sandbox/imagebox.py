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
Everything else stays as for every sandbox: the action's processes drop to the sandbox uid with
no_new_privs and the syscall filter (`child.setup`), in the same namespaces and cgroups.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from .. import _linux
from . import child

LAYER_DIR = "/sandbox/layer"  # the writable layer (upper + overlay work dir)
ROOT_DIR = "/sandbox/root"  # where the image is mounted before the pivot
# python3 of the image: its session worker (a persistent interpreter) and one-shot runs
PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3")
python: str | None = None  # set once the sandbox is in an image (`enter`)


def _recv_fds(fd: int, n: int) -> list[int]:
    s = socket.socket(fileno=os.dup(fd))
    try:
        s.setblocking(True)
        _msg, fds, _flags, _addr = socket.recv_fds(s, 1, 2)
    finally:
        s.close()
    if len(fds) != n:
        for x in fds:
            os.close(x)
        raise OSError(f"image: expected {n} fds (the layers directory, the writable layer), "
                      f"got {len(fds)}")
    return fds


def enter(req: dict[str, Any], fd: int) -> dict[str, Any]:
    """Mount the image's layers (``req["layers"]``: names under the received directory, top
    first) with a writable layer of ``req["layer_mb"]`` MiB and pivot into it."""
    global python
    t0 = time.perf_counter()
    on_disk = req.get("layer") == "disk"
    fds = _recv_fds(fd, 2 if on_disk else 1)
    layers_fd = fds[0]
    try:
        uid, gid = int(req["uid"]), int(req["gid"])
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
    wd = r + child.WORKDIR
    if os.path.islink(wd) or (os.path.lexists(wd) and not os.path.isdir(wd)):
        os.unlink(wd)
    if not os.path.isdir(wd):
        os.mkdir(wd, 0o755)
    os.chown(wd, uid, gid)  # (the top directory only: a metadata copy-up)
    _linux.mount("proc", f"{r}/proc", "proc", nosuid | _linux.MS_NOEXEC)
    _linux.mount("/dev", f"{r}/dev", None, _linux.MS_BIND | _linux.MS_REC)
    os.chdir(r)
    _linux.pivot_root(".", ".")
    _linux.umount2(".", _linux.MNT_DETACH)
    os.chdir("/")
    python = next((p for p in PYTHONS if os.access(p, os.X_OK)), None)
    return {"ok": True, "enter_s": round(time.perf_counter() - t0, 6), "python": python}


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
