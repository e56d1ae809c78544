"""`tangram serve` refuses unsafe binds and bad configs before starting anything."""

import argparse
from pathlib import Path

import pytest

from arl_tangram.cli import demo, serve


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command")
    serve.add_parser(sub)
    demo.add_parser(sub)
    return ap.parse_args(list(argv))


def test_non_loopback_needs_token(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANGRAM_TOKEN", raising=False)
    assert serve.run(parse("serve", "--host", "0.0.0.0", "--no-models")) == 2
    assert "token" in capsys.readouterr().err


def test_bad_config_names_file_line_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "svc.yaml"
    p.write_text("policy: tangram\nlimits:\n  tick_s: 0\n")
    assert serve.run(parse("serve", "--config", str(p))) == 2
    err = capsys.readouterr().err
    assert f"{p}:3: limits" in err and "tick_s" in err


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANGRAM_TOKEN", "abc")
    cfg = serve.load_config(parse("serve", "--no-models", "--policy", "fifo", "--port", "9999"))
    assert cfg.token == "abc" and cfg.policy == "fifo" and cfg.port == 9999


def test_demo_rejects_unknown_policy() -> None:
    assert demo.run(parse("demo", "--policies", "nope", "--no-progress")) == 2
