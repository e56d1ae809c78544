"""Issue 25, tokens (the review's 5b): `tangram serve` refuses a token shorter than 16 characters
or all whitespace for a non-loopback bind (exit 2, a clear line); `--token-file` reads the
token from a file; `--token` (argv, visible in ps) is warned against in `--help` and at start."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from arl_tangram.cli import serve


def _parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    serve.add_parser(ap.add_subparsers(dest="command"))
    return ap.parse_args(list(argv))


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """uvicorn.run recorded instead of listening."""
    import uvicorn

    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.delenv("TANGRAM_TOKEN", raising=False)
    monkeypatch.setattr(serve, "_ray_engine", lambda *a: None)
    import arl_tangram.runtime.build as build

    monkeypatch.setattr(build, "build_engine", lambda cfg: _NoEngine())
    return calls


class _NoEngine:
    pass


@pytest.mark.parametrize("token", [" ", "  ", " " * 20, "\t\n", "short", "x" * 15,
                                   " " + "x" * 14 + " "])
def test_weak_tokens_are_refused_off_loopback(token: str, started: list[dict],
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for how in ("argv", "env"):
        if how == "argv":
            args = _parse("serve", "--host", "0.0.0.0", "--no-models", "--token", token)
        else:
            monkeypatch.setenv("TANGRAM_TOKEN", token)
            args = _parse("serve", "--host", "0.0.0.0", "--no-models")
        assert serve.run(args) == 2, (how, token)
        err = capsys.readouterr().err
        assert "needs a token" in err and "--token-file" in err, err
        monkeypatch.delenv("TANGRAM_TOKEN", raising=False)
    assert started == []


def test_token_file_is_the_way(tmp_path: Path, started: list[dict],
                               capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "token"
    f.write_text("s3cr3t-t0ken-0123456789\n")
    cfg = serve.load_config(_parse("serve", "--no-models", "--token-file", str(f)))
    assert cfg.token == "s3cr3t-t0ken-0123456789"
    assert serve.run(_parse("serve", "--host", "0.0.0.0", "--no-models",
                            "--token-file", str(f))) == 0
    assert started and started[0]["host"] == "0.0.0.0"
    assert "warning" not in capsys.readouterr().err  # (no argv token: nothing to warn about)


def test_token_file_errors(tmp_path: Path, started: list[dict],
                           capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.run(_parse("serve", "--host", "0.0.0.0", "--no-models",
                            "--token-file", str(tmp_path / "missing"))) == 2
    assert "--token-file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert serve.run(_parse("serve", "--no-models", "--token-file", str(empty))) == 2
    assert "empty" in capsys.readouterr().err
    short = tmp_path / "short"
    short.write_text("abc\n")
    assert serve.run(_parse("serve", "--host", "0.0.0.0", "--no-models",
                            "--token-file", str(short))) == 2
    assert "at least 16" in capsys.readouterr().err
    assert serve.run(_parse("serve", "--no-models", "--token", "x" * 20,
                            "--token-file", str(short))) == 2
    assert started == []


def test_argv_token_is_warned_against(started: list[dict],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.run(_parse("serve", "--host", "0.0.0.0", "--no-models",
                            "--token", "a-strong-enough-token-1234")) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "ps" in err and "TANGRAM_TOKEN" in err


def test_help_warns_about_argv(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("serve", "--help")
    out = " ".join(capsys.readouterr().out.split())
    assert "--token-file" in out and "visible to every local user" in out


def test_loopback_keeps_short_tokens(started: list[dict],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANGRAM_TOKEN", "abc")
    assert serve.run(_parse("serve", "--no-models")) == 0
