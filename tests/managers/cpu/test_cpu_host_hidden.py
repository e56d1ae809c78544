"""Nothing of the host inside a sandbox: markers planted in the service's argv, environment,
working directory and config file (which lies under /etc) are found nowhere a sandbox can look
(issue 16, item 1).

A real `tangram serve` runs with the markers; a probe action (through `/run_code`, both on the
direct path, where the action is its sandbox's PID 1, and as a child of the sandbox's init)
reads every /proc entry it may, /sys, the file system it sees, its descriptors 0..1023, its
environment and every readable page of its own memory, and reports each marker-shaped string.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.needs_root

PROBE = r'''
import ctypes, json, os, re, stat, sys
PAT = re.compile(rb"TGMK" + rb"[0-9a-f]{16}")
hits, seen = [], {"files": 0, "links": 0, "names": 0, "bytes": 0, "mem": 0}
def scan(where, data):
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    seen["bytes"] += len(data)
    for m in PAT.finditer(data):
        hits.append([where, m.group().decode()])
def read(path, cap=1 << 22):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) and not path.startswith(("/proc", "/sys")):
            return
        data = os.read(fd, cap)
        seen["files"] += 1
        scan(path, data)
    except OSError:
        pass
    finally:
        os.close(fd)
def link(path):
    try:
        t = os.readlink(path)
    except OSError:
        return
    seen["links"] += 1
    scan(path + " ->", t)
SKIP = {"mem", "pagemap", "kcore", "kmsg", "kpagecount", "kpageflags", "kpagecgroup",
        "sysrq-trigger", "clear_refs", "map_files"}
def walk(top, depth, budget=[60000]):
    try:
        names = os.listdir(top)
    except OSError:
        return
    for n in names:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        p = top.rstrip("/") + "/" + n
        seen["names"] += 1
        scan("name " + p, p)
        if n in SKIP:
            continue
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            link(p)
        elif stat.S_ISDIR(st.st_mode):
            if depth > 0:
                walk(p, depth - 1)
        else:
            read(p)
# /proc: every process this sandbox can see (and its tasks), then the global files
pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
for pid in pids:
    walk(f"/proc/{pid}", 3)
walk("/proc/self", 3)
walk("/proc/thread-self", 2)
for n in os.listdir("/proc"):
    if not n.isdigit() and n not in ("self", "thread-self"):
        p = "/proc/" + n
        (walk(p, 4) if os.path.isdir(p) and not os.path.islink(p) else read(p))
walk("/sys", 6)
# the file system: everything but the read-only system and toolchain binds (checked by path)
mounts = []
for line in open("/proc/self/mountinfo"):
    f = line.split()
    mounts.append(f[4])
    scan("mountinfo", line)
OWN = {"/", "/etc", "/tmp", "/workdir", "/dev", "/sandbox"}
def fs(top):
    try:
        names = os.listdir(top)
    except OSError:
        return
    for n in names:
        p = top.rstrip("/") + "/" + n
        seen["names"] += 1
        scan("name " + p, p)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            link(p)
        elif stat.S_ISDIR(st.st_mode):
            if p in ("/proc", "/sys") or (p in mounts and p not in OWN):
                continue
            fs(p)
        elif stat.S_ISREG(st.st_mode) and st.st_size < 1 << 20:
            read(p)
fs("/")
scan("cwd", os.getcwd())
for fd in range(1024):
    link(f"/proc/self/fd/{fd}")
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if stat.S_ISREG(st.st_mode):
        try:
            scan(f"fd {fd}", os.pread(fd, 1 << 22, 0))
        except OSError:
            pass
    elif stat.S_ISSOCK(st.st_mode):
        import socket
        try:
            s = socket.socket(fileno=os.dup(fd))
            scan(f"fd {fd} name", repr((s.getsockname(), s.getpeername())))
            s.close()
        except OSError:
            pass
scan("environ", repr(dict(os.environ)))
scan("argv", repr((sys.argv, sys.orig_argv, sys.path, sys.executable)))
# every readable page of this process's memory
for line in open("/proc/self/maps"):
    f = line.split()
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    if f[1][0] != "r" or (len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
        continue
    for a in range(lo, hi, 1 << 24):
        chunk = ctypes.string_at(a, min(1 << 24, hi - a))
        seen["mem"] += len(chunk)
        scan(f"memory {f[0]} {' '.join(f[5:])}", chunk)
print(json.dumps({"hits": hits[:50], "pids": pids, "seen": seen}))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marker() -> str:
    return "TGMK" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def service() -> Iterator[dict[str, object]]:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    m = {k: _marker() for k in ("argv", "env", "config", "path", "cwd")}
    top = tempfile.mkdtemp(prefix=f"tangram-{m['path']}-")
    work = os.path.join(top, f"work-{m['config']}")
    # the config file (markers, token inside) lies under /etc, which sandboxes see: it is
    # masked there (its name holds no marker: the fork server learns the path it masks)
    cfg = f"/etc/tangram-hidden-test-{os.getpid()}.yaml"
    if not os.access("/etc", os.W_OK):
        cfg = os.path.join(top, "service.yaml")
    with open(cfg, "w") as f:
        f.write("policy: tangram\n"
                f"auth: {{token: {m['config']}}}\n"
                "nodes:\n"
                f"  - name: node-{m['config']}\n"
                f"    labels: {{secret: {m['config']}}}\n"
                "    gpu: false\n"
                f"    cpu: {{work_root: {work}, warm_min: 1, warm_max: 2}}\n")
    cwd = os.path.join(top, f"cwd-{m['cwd']}")
    os.mkdir(cwd)
    port = _free_port()
    env = {**os.environ, "TANGRAM_TEST_SECRET": m["env"], "TANGRAM_TOKEN": m["env"]}
    tangram = os.path.join(os.path.dirname(sys.executable), "tangram")
    proc = subprocess.Popen([tangram, "serve", "--config", cfg, "--port", str(port),
                             "--no-models", "--token", m["argv"], "--log-level", "warning"],
                            cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail(f"tangram serve exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(url + "/v1/ping", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        yield {"markers": m, "url": url, "token": m["argv"], "pid": proc.pid, "config": cfg}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(top, ignore_errors=True)
        if cfg.startswith("/etc/"):
            os.unlink(cfg)


def _run_probe(service: dict[str, object], **extra: object) -> dict[str, object]:
    body = json.dumps({"code": PROBE, "language": "python", "run_timeout": 60, **extra}).encode()
    req = urllib.request.Request(str(service["url"]) + "/run_code", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {service['token']}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        res = json.loads(r.read())
    run = res.get("run_result") or {}
    assert res["status"] == "Success", (res.get("message"), run.get("stderr", "")[-3000:])
    out: dict[str, object] = json.loads(run["stdout"])
    return out


def test_the_markers_are_planted_where_the_service_sees_them(service: dict[str, object]) -> None:
    """(The premise.) The service's own argv, environment and working directory hold them."""
    m = service["markers"]
    assert isinstance(m, dict)
    pid = service["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert m["argv"].encode() in f.read()
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert m["env"].encode() in f.read()
    assert m["cwd"] in os.readlink(f"/proc/{pid}/cwd")
    with open(str(service["config"])) as f:
        assert m["config"] in f.read()


@pytest.mark.parametrize("path", ["direct", "child"])
def test_nothing_of_the_service_is_visible_inside_a_sandbox(service: dict[str, object],
                                                            path: str) -> None:
    """``direct``: the probe is its sandbox's PID 1 (a fork of the fork server);
    ``child``: it runs in a child of the sandbox's init (``fetch_files`` takes that path)."""
    got = _run_probe(service, **({"fetch_files": ["none"]} if path == "child" else {}))
    seen = got["seen"]
    assert isinstance(seen, dict)
    # it really looked: /proc, the file system, descriptors and megabytes of its own memory
    assert seen["files"] > 200 and seen["links"] > 20 and seen["mem"] > 4 << 20, seen
    assert got["hits"] == [], got["hits"]
    # only the sandbox's own processes (its PID namespace): PID 1 and, on the child path, a few
    pids = got["pids"]
    assert isinstance(pids, list) and 1 in pids and max(pids) < 16, pids
