"""How building the syscall filter fails (issue 27, mutation testing of zygote/seccomp.py): every
step that libseccomp can refuse raises an OSError with that step's errno and a message naming
it, the context is released whatever happens, a malformed export is refused, and the fork
server's builder child (`build_apart`) brings back the builder's error -- or says it died.
Faults are injected into a real libseccomp through a proxy; no sandbox, no root needed."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from arl_tangram.managers.cpu.zygote import seccomp


class _Lib:
    """The real libseccomp, but ``fail`` names a step to refuse: ``(function, what, rc)``."""

    def __init__(self, fail: tuple[str, str, int] | None = None, export: bytes | None = None) -> None:
        self.real = seccomp._lib()
        self.fail, self.export = fail, export
        self.released: list[Any] = []
        self.ctx: Any = None

    def seccomp_init(self, action: int) -> Any:
        if self.fail and self.fail[0] == "init":
            return None
        self.ctx = self.real.seccomp_init(action)
        return self.ctx

    def seccomp_attr_set(self, ctx: Any, attr: int, value: int) -> int:
        if self.fail == ("attr", "badarch", self.fail[2] if self.fail else 0) and attr == 2:
            return self.fail[2]
        return int(self.real.seccomp_attr_set(ctx, attr, value))

    def seccomp_syscall_resolve_name(self, name: bytes) -> int:
        return int(self.real.seccomp_syscall_resolve_name(name))

    def seccomp_rule_add_array(self, ctx: Any, action: int, nr: int, n: int, cmp: Any) -> int:
        if self.fail and self.fail[0] == "rule" and nr == self.seccomp_syscall_resolve_name(
                self.fail[1].encode()):
            return self.fail[2]
        return int(self.real.seccomp_rule_add_array(ctx, action, nr, n, cmp))

    def seccomp_export_bpf(self, ctx: Any, fd: int) -> int:
        if self.fail and self.fail[0] == "export":
            return self.fail[2]
        if self.export is not None:
            os.write(fd, self.export)
            return 0
        return int(self.real.seccomp_export_bpf(ctx, fd))

    def seccomp_release(self, ctx: Any) -> None:
        self.released.append(ctx)
        self.real.seccomp_release(ctx)


def _with(monkeypatch: pytest.MonkeyPatch, lib: _Lib) -> None:
    monkeypatch.setattr(seccomp, "_lib", lambda: lib)


def test_a_missing_libseccomp_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise OSError("libseccomp.so.2: cannot open shared object file")

    monkeypatch.setattr(seccomp, "_lib", missing)
    with pytest.raises(OSError) as err:
        seccomp.build()
    assert err.value.errno == errno.ENOENT
    assert err.value.strerror == ("libseccomp.so.2 not found (Debian: libseccomp2): "
                                  "libseccomp.so.2: cannot open shared object file")


def test_a_failed_init_is_enomem(monkeypatch: pytest.MonkeyPatch) -> None:
    _with(monkeypatch, _Lib(fail=("init", "", 0)))
    with pytest.raises(OSError) as err:
        seccomp.build()
    assert (err.value.errno, err.value.strerror) == (errno.ENOMEM, "seccomp_init failed")


@pytest.mark.parametrize(("fail", "what"), [
    (("attr", "badarch", -errno.EINVAL), "badarch"),
    (("rule", "ptrace", -errno.EFAULT), "ptrace"),
    (("rule", "clone", -errno.EINVAL), "clone"),
    (("rule", "clone3", -errno.EEXIST), "clone3"),
    (("export", "", -errno.ENOMEM), "export"),
])
def test_a_refused_step_raises_its_errno_naming_the_step(
        monkeypatch: pytest.MonkeyPatch, fail: tuple[str, str, int], what: str) -> None:
    lib = _Lib(fail=fail)
    _with(monkeypatch, lib)
    with pytest.raises(OSError) as err:
        seccomp.build()
    e = -fail[2]
    assert (err.value.errno, err.value.strerror) == (e, f"libseccomp: {what}: {os.strerror(e)}")
    assert lib.released == [lib.ctx] and lib.ctx  # released, failure or not


@pytest.mark.parametrize("export", [b"", b"12345", b"123456789"])
def test_an_empty_or_malformed_export_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                 export: bytes) -> None:
    lib = _Lib(export=export)
    _with(monkeypatch, lib)
    with pytest.raises(OSError) as err:
        seccomp.build()
    assert (err.value.errno, err.value.strerror) == (
        errno.EINVAL, "libseccomp exported an empty or malformed program")
    assert lib.released == [lib.ctx]


def test_a_whole_export_is_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    prog = bytes(range(8)) * 3  # three 8-byte instructions (never installed here)
    lib = _Lib(export=prog)
    _with(monkeypatch, lib)
    assert seccomp.build().bpf == prog and lib.released == [lib.ctx]


@pytest.mark.parametrize(("exc", "want"), [
    (OSError(errno.EPERM, "no permission to build"), (errno.EPERM, "no permission to build")),
    (OSError("no errno"), (errno.EIO, "no errno")),
])
def test_the_builder_childs_error_comes_back(monkeypatch: pytest.MonkeyPatch, exc: OSError,
                                            want: tuple[int, str]) -> None:
    def fails() -> Any:
        raise exc

    monkeypatch.setattr(seccomp, "build", fails)
    with pytest.raises(OSError) as err:
        seccomp.build_apart()
    assert err.value.errno == want[0] and want[1] in str(err.value.strerror)


def test_a_builder_child_that_died_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp, "build", lambda: os._exit(3))
    with pytest.raises(OSError) as err:
        seccomp.build_apart()
    assert (err.value.errno, err.value.strerror) == (errno.EIO, "the builder died")


def test_build_apart_brings_back_the_program() -> None:
    here, apart = seccomp.build(), seccomp.build_apart()
    assert apart.bpf == here.bpf and apart.denied == here.denied and len(apart.bpf) % 8 == 0
