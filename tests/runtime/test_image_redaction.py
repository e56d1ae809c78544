"""Image errors and sources name no host path (issue 35, L2): what a client reads of an import
that failed says "the archive" and "<image cache>", not the spool's or the cache's host paths;
its class stays (a bound passed is still ImageTooLarge: 413)."""

from __future__ import annotations

from arl_tangram.core.errors import ImageError, ImageTooLarge
from arl_tangram.runtime.images.cache import redacted as _redacted


def test_the_spool_and_the_cache_are_not_named() -> None:
    spool, root = "/srv/spool/tangram-upload-ab12/image.tar", "/var/lib/tangram/images"
    exc = ImageError(f"{spool}: layer 1: cannot unpack: [Errno 20] Not a directory: "
                     f"'{root}/tmp/layer-x1/root/d/f'")
    out = _redacted(exc, spool, root)
    assert out is exc and type(out) is ImageError
    assert str(out) == ("the archive: layer 1: cannot unpack: [Errno 20] Not a directory: "
                        "'<image cache>/tmp/layer-x1/root/d/f'")


def test_its_class_is_kept() -> None:
    exc = ImageTooLarge("/var/c/tmp/layer-2: expands past 64 MiB")
    out = _redacted(exc, "/x/image.tar", "/var/c")
    assert isinstance(out, ImageTooLarge)
    assert str(out) == "<image cache>/tmp/layer-2: expands past 64 MiB"


def test_a_message_without_host_paths_is_left_alone() -> None:
    exc = ImageError("entry '/etc/passwd' is an absolute path")
    assert str(_redacted(exc, "/x/image.tar", "/var/c")) == "entry '/etc/passwd' is an absolute path"
