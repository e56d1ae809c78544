"""Service config files: good files parse; bad ones name file:line: field."""

from pathlib import Path

import pytest

from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import default_config, load_service_config


def test_full_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("policy: fifo\nserver: {host: 0.0.0.0, port: 9000}\nauth: {token: t0123456789abcdef}\n"
                 "limits: {max_pending: 10}\nnodes:\n  - name: n1\n    capacity: {cpu: 4}\n"
                 "    gpu: false\nmodels:\n  - {name: rm, kind: scalar, path: /x}\n")
    cfg = load_service_config(p)
    assert cfg.policy == "fifo" and cfg.port == 9000 and cfg.token == "t0123456789abcdef"
    assert cfg.nodes[0].name == "n1" and cfg.nodes[0].gpu is None
    assert cfg.nodes[0].capacity["cpu"] == 4 and cfg.limits.max_pending == 10
    assert cfg.default_reward_model == "rm"


@pytest.mark.parametrize(("text", "line", "field"), [
    ("policy: best\n", None, "policy"),
    ("nodes:\n  - name: a\n    colour: red\n", 2, "nodes[0].colour"),
    ("limits:\n  max_pending: -1\n", 2, "limits"),
    ("models:\n  - {kind: scalar}\n", 2, "models[0].name"),
    ("models:\n  - {name: m, kind: wrong}\n", 2, "models[0]"),
    ("server: {port: 0}\n", None, "port"),
    ("nodes: [a, b\n", 2, "<yaml>"),
    ("scheduler:\n  short_action_s: -1\n", 2, "scheduler"),
    ("scheduler:\n  colour: red\n", 2, "scheduler.colour"),
    ("images:\n  - {name: a, path: /x, eager: 1}\n", 2, "images[0].eager"),
    ("images:\n  - {name: \"x\\n\", path: /x}\n", 2, "images[0].name"),  # (issue 35, L3)
    ("limits:\n  header_timeout_s: 0\n", 2, "limits"),  # (issue 35, M4)
    ("limits:\n  max_connections_per_ip: -1\n", 2, "limits"),
])
def test_errors_name_file_line_field(tmp_path: Path, text: str, line: int | None, field: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as ei:
        load_service_config(p)
    assert ei.value.field == field and str(p) in str(ei.value)
    if line is not None:
        assert ei.value.line == line


def test_scheduler_knobs_reach_the_core(tmp_path: Path) -> None:
    from arl_tangram.runtime.build import engine_config
    from arl_tangram.runtime.engine import make_core

    p = tmp_path / "c.yaml"
    p.write_text("scheduler:\n  warm_keys: [python, bash]\n  short_action_s: 0\n  aging_s: 5\n")
    cfg = load_service_config(p)
    core = make_core(engine_config(cfg), [])
    assert core.config.warm_keys == ("python", "bash") and core.config.short_action_s == 0
    assert core.config.aging_s == 5


def test_images_eager_reach_the_ray_executor(tmp_path: Path) -> None:
    from arl_tangram.runtime.ray_executor import RayExecutor

    p = tmp_path / "c.yaml"
    p.write_text("images:\n  - {name: swe, path: /shared/swe.tar}\n"
                 "  - {name: base, path: /shared/base, eager: true}\n")
    cfg = load_service_config(p)
    assert cfg.images == (("swe", "/shared/swe.tar"), ("base", "/shared/base"))
    assert cfg.eager_images == ("base",)
    ex = RayExecutor.from_service_config(cfg)
    assert ex.config.images == cfg.images and ex.config.eager_images == ("base",)
    assert ex.image_sources == {"swe": "/shared/swe.tar", "base": "/shared/base"}


def test_default_is_this_machine() -> None:
    cfg = default_config(with_models=False)
    assert cfg.nodes[0].name == "local" and cfg.models == () and cfg.host == "127.0.0.1"
