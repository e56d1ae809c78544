"""`tangram serve` never binds a non-loopback address without a token (issue 27, audit A3):
the empty host (every interface), 0.0.0.0 and :: are refused before anything starts."""

from __future__ import annotations

import argparse

import pytest

from arl_tangram.api.middleware import is_loopback
from arl_tangram.cli import serve


def _parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    serve.add_parser(ap.add_subparsers(dest="command"))
    return ap.parse_args(list(argv))


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that would start fails the test instead of listening."""
    import uvicorn

    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError(f"tangram serve started a server on {kw.get('host')!r}")

    monkeypatch.setattr(uvicorn, "run", refuse)
    monkeypatch.delenv("TANGRAM_TOKEN", raising=False)


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "[::]", "192.0.2.7", "example.org"])
def test_every_interface_or_a_public_host_needs_a_token(
        host: str, no_server: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.run(_parse("serve", "--host", host, "--no-models")) == 2
    err = capsys.readouterr().err
    assert "needs a token" in err and "TANGRAM_TOKEN" in err


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "[::]", "0:0:0:0:0:0:0:0", "10.0.0.1",
                                  "X127.0.0.1X", "local", "localhost.evil.example"])
def test_wildcards_and_public_addresses_are_not_loopback(host: str) -> None:
    assert is_loopback(host) is False


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"])
def test_loopback_addresses_are_loopback(host: str) -> None:
    assert is_loopback(host) is True
