"""Manager-side channels: a sandbox's request/reply connection and the fork server's client.

Invariant: every reply is matched to its request in order (one reply per request frame on a
sandbox connection; one reply per sandbox asked for on the fork server's socket), all I/O is
non-blocking and driven by the event loop's reader callbacks, and a broken or closed channel
fails every waiter at once. Everything here must be used from the one event-loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from arl_tangram.core.errors import BrokenError, ClosedError

from .. import wire
from .reaper import ReapedProc, Reaper, zygote_env


class Conn:
    """Length-prefixed JSON request/reply over a non-blocking socket, one reply per request."""

    __slots__ = ("_buf", "_loop", "_waiters", "closed", "sock")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        self.sock, self._loop, self._buf = sock, loop, bytearray()
        self._waiters: collections.deque[asyncio.Future[dict[str, Any]]] = collections.deque()
        self.closed = False
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            return self.close(e)
        if not data:
            return self.close(EOFError("sandbox closed its socket"))
        buf = self._buf
        buf += data
        while len(buf) >= 4:
            n = int.from_bytes(buf[:4], "big")
            if n > wire.MAX_FRAME or not self._waiters:
                return self.close(ValueError("unexpected or oversized frame from a sandbox"))
            if len(buf) < 4 + n:
                return
            try:
                msg = json.loads(bytes(buf[4:4 + n]))
                if not isinstance(msg, dict):
                    raise ValueError("frame is not an object")
            except ValueError as e:
                return self.close(e)
            del buf[:4 + n]
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(msg)

    async def request(self, msg: Mapping[str, Any] | bytes,
                      timeout: float | None = None) -> dict[str, Any]:
        """Send ``msg`` (a request, or a frame already encoded) and wait for the reply."""
        if self.closed:
            raise EOFError("sandbox connection closed")
        fut = self._loop.create_future()
        self._waiters.append(fut)
        data = msg if isinstance(msg, bytes) else wire.encode_request(msg)
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as e:
            self.close(e)
            n = len(data)
        if n < len(data):
            await self._loop.sock_sendall(self.sock, data[n:])
        timer = None if timeout is None else self._loop.call_later(
            timeout, _expire, fut, timeout)
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()

    def close(self, why: BaseException | None = None) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(why or EOFError("sandbox connection closed"))


def _expire(fut: asyncio.Future[Any], timeout: float) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"no reply within {timeout:g} s"))


class Zygote:
    """The fork server process and its control socket (a SOCK_SEQPACKET): one request asks for
    n sandboxes, n replies come back in order (each with its fds), and a direct sandbox's end
    comes as an "exit" message, always after its spawn reply."""

    def __init__(self, cfg: dict[str, Any], root_parent: str,
                 cgroup_dirs: list[str] | tuple[str, ...] = (), reaper: Reaper | None = None) -> None:
        """Start the fork server; ``cfg["root"]`` names its root's mount point inside the
        directory ``root_parent``. Nothing of the service is in its argv (``-P``: not even the
        working directory on ``sys.path``; it runs in ``/``) or environment: the configuration
        and an fd of ``root_parent`` come as the first message on the control socket, with an
        fd of each of ``cgroup_dirs`` (`CgroupTree.join_dirs`: then a sandbox asked for with a
        slot name moves itself into that slot, see `spawn`). With ``reaper``, the reaper starts
        it, as its child (`host/reaper.py`): a sandbox it orphans goes to the reaper, not to the
        system's init."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc: subprocess.Popen[bytes] | ReapedProc
        try:
            if reaper is not None:
                argv = [sys.executable, "-P", "-m", "arl_tangram.managers.cpu.zygote.server", "3"]
                self.proc = ReapedProc(reaper, reaper.start_zygote(argv, zygote_env(),
                                                                   theirs.fileno()))
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "arl_tangram.managers.cpu.zygote.server",
                     str(theirs.fileno())],
                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, close_fds=True, env=zygote_env(), cwd="/")
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.ctl = ours
        fds = [os.open(root_parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            for d in cgroup_dirs:
                fds.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            socket.send_fds(ours, [json.dumps(cfg).encode()], fds)
        finally:
            for fd in fds:
                os.close(fd)
        self.hello: dict[str, Any] = {}
        # one per sandbox asked for: resolved with what `adopt` made of it, or an error
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_exit: Any = None  # (pid, rc) of a direct sandbox's PID 1, from the fork server
        self.on_broken: Any = None  # called once the fork server is gone
        self.adopt: Any = None  # (pid, socket, pipe read ends, uid) -> the sandbox, or an error
        self.gone: str | None = None  # why it is gone (it died, or we closed it); None: up
        self._pidfd: int | None = None  # watched on the loop: its death is noticed at once

    def wait_hello(self, timeout: float = 60.0) -> dict[str, Any]:
        """Blocking (run it in a thread); the first message of the fork server."""
        self.ctl.settimeout(timeout)
        try:
            msg = self.ctl.recv(1 << 16)
        except OSError as e:
            msg = json.dumps({"ok": False, "error": f"fork server did not start: {e}"}).encode()
        self.ctl.settimeout(None)
        self.hello = json.loads(msg) if msg else {"ok": False, "error": "fork server exited"}
        return self.hello

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.ctl.setblocking(False)
        loop.add_reader(self.ctl.fileno(), self._readable)
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except OSError:  # (already reaped: the control socket's EOF tells)
            self._pidfd = None
        else:
            loop.add_reader(self._pidfd, self._died)

    def _died(self) -> None:
        """Its pidfd fired: the fork server exited. Reaped here (no zombie), every waiter fails
        with a reason that says it died."""
        self._unwatch()
        self._fail(BrokenError(f"the sandbox fork server died ({self.exit_reason()})"))

    def _closed_socket(self) -> None:
        """Its control socket closed and its pidfd did not follow (still running: a bug of its
        own): killed, and as good as dead."""
        if self.gone is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            self._fail(BrokenError("the sandbox fork server died (its control socket closed)"))

    def exited(self) -> bool:
        """It is gone, or exiting: its pidfd is readable though the loop may not have run its
        callback yet (a sandbox it took along can be seen dead first)."""
        if self.gone is not None:
            return True
        fd = self._pidfd
        return fd is not None and bool(select.select([fd], [], [], 0)[0])

    def exit_reason(self) -> str:
        """How the fork server ended, once it has (it is reaped here); "still running" else."""
        # (a fork server the reaper started is reaped there: its word comes a moment later)
        wait_s = 0.0 if isinstance(self.proc, subprocess.Popen) else 0.5
        try:
            rc = self.proc.wait(wait_s) if self.proc.returncode is None else self.proc.returncode
        except subprocess.TimeoutExpired:
            return "still running"
        if rc < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-rc).name}"
            return f"killed by signal {-rc}"
        return f"exit status {rc}"

    def _unwatch(self) -> None:
        if self._pidfd is not None:
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None

    def _readable(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.ctl, 1 << 16, 3)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg, fds = b"", []
        if not msg:  # it is exiting: its pidfd fires next (`_died`, with how it ended)
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self.ctl.fileno())
            if self._pidfd is not None and self._loop is not None:
                self._loop.call_later(0.5, self._closed_socket)
            else:
                self._closed_socket()
            return
        try:
            reply = json.loads(msg)
        except ValueError:
            reply = {"error": "bad reply from the fork server"}
        if "exit" in reply:  # not a spawn reply: a direct sandbox's exit status
            if self.on_exit is not None:
                self.on_exit(int(reply["exit"]), int(reply["rc"]))
            return
        fut = self._waiters.popleft() if self._waiters else None
        if fut is None or fut.done():  # its spawn was cancelled: the init exits on EOF
            for fd in fds:
                os.close(fd)
            return
        if "error" in reply or not fds or self.adopt is None:
            for fd in fds:
                os.close(fd)
            fut.set_result(BrokenError(f"sandbox spawn failed: {reply.get('error')}"))
            return
        # adopted at once, in order: its exit report (a later message) always finds it. (The
        # fork server's end of a sandbox's socketpair: named, so that Python need not ask.)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fds[0])
        fut.set_result(self.adopt(int(reply["pid"]), sock, fds[1:], int(reply["uid"])))

    def _fail(self, e: BaseException) -> None:
        if self.gone is None:
            self.gone = str(e)
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.ctl.fileno())
        if self.on_broken is not None:
            self.on_broken, broken = None, self.on_broken
            broken()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(e)

    async def spawn(self, n: int = 1, warm: bool = True,
                    join: list[str] | None = None) -> list[Any]:
        """``n`` new sandboxes, forked together on one request: per sandbox what `adopt` made
        of it, or the error. ``warm=False``: a direct sandbox does not warm its hot path (it is
        about to be used: warming would only add its own CPU to the faults the action takes).
        ``join`` (one cgroup slot name per sandbox; only when the fork server holds the cgroup
        directories, ``hello["cgroup_join"]``): the i-th sandbox's init moves itself into the
        i-th slot before anything else, and ends if it cannot."""
        assert self._loop is not None, "Zygote.attach() first"
        assert 1 <= n <= 64, "the fork server makes at most 64 sandboxes per request"
        assert join is None or len(join) == n
        if self.gone is not None:
            return [BrokenError(self.gone)] * n
        futs = [self._loop.create_future() for _ in range(n)]
        self._waiters.extend(futs)
        msg = b'{"op":"spawn","n":%d%s%s}' % (
            n, b"" if warm else b',"cfg":{"warm_direct":false}',
            b"" if join is None else b',"join":' + json.dumps(join).encode())
        try:
            self.ctl.send(msg)
        except BlockingIOError:
            await self._loop.sock_sendall(self.ctl, msg)
        except OSError as e:
            self._fail(BrokenError(f"the sandbox fork server is gone: {e}"))
        # (if we are cancelled, gather cancels the futures: the sockets of sandboxes still to
        # come are closed on arrival, and those inits exit on EOF)
        got = await asyncio.gather(*futs, return_exceptions=True)
        return [r if not isinstance(r, BaseException) or isinstance(r, Exception)
                else BrokenError(str(r)) for r in got]

    def give_ids(self, uids: list[int]) -> None:
        """Sandbox ids it was told were held (``ids_held``: sessions that outlived an earlier fork
        server) whose sandboxes are gone: it may lend them again."""
        if self.gone is not None or not uids:
            return
        with contextlib.suppress(OSError):
            self.ctl.send(b'{"op":"ids","free":%s}' % json.dumps(sorted(uids)).encode())

    def close(self, why: str = "the CPU manager is closed") -> None:
        self._unwatch()
        self._fail(ClosedError(why))
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)
