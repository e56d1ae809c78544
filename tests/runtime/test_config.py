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
    # a node's manager sections are built when the file is parsed, the key named (issue 36)
    ("nodes:\n  - name: a\n    cpu: {warm_min: 4, warm_max: 2}\n", 3, "nodes[0].cpu.warm_max"),
    ("nodes:\n  - name: a\n    cpu:\n      workdir_max_mb: 0\n", 4, "nodes[0].cpu.workdir_max_mb"),
    ("nodes:\n  - name: a\n    cpu:\n      colour: red\n", 4, "nodes[0].cpu.colour"),
    ("nodes:\n  - name: a\n    cpu:\n      fork_server_max_crashes: 0\n", 4,
     "nodes[0].cpu.fork_server_max_crashes"),
    ("nodes:\n  - name: a\n    cpu: [1]\n", 2, "nodes[0].cpu"),
    ("nodes:\n  - name: a\n  - name: b\n    gpu: {device: tpu}\n", 4, "nodes[1].gpu.device"),
    ("nodes:\n  - name: a\n    gpu:\n      max_length: 0\n", 4, "nodes[0].gpu.max_length"),
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
    assert core.config is cfg.core  # built once, when the service config was (issue 36)


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


def test_node_sections_parse_into_the_managers_typed_configs(tmp_path: Path) -> None:
    from arl_tangram.managers.cpu import CpuManagerConfig
    from arl_tangram.managers.gpu.config import GpuManagerConfig

    p = tmp_path / "c.yaml"
    p.write_text("nodes:\n  - name: a\n    cpu: {work_root: /srv/w, warm_max: 7}\n"
                 "    gpu: {device: cpu, cpu_devices: 3}\n  - name: b\n")
    a, b = load_service_config(p).nodes
    assert a.cpu == CpuManagerConfig(work_root="/srv/w", warm_max=7,
                                     hidden_paths=(str(p.resolve()),))
    assert a.gpu == GpuManagerConfig(device="cpu", cpu_devices=3)
    assert b.cpu == CpuManagerConfig(hidden_paths=(str(p.resolve()),))  # (the file's own path)
    assert b.gpu == GpuManagerConfig()


def test_the_ray_nodes_get_only_what_the_file_set(tmp_path: Path) -> None:
    """A Ray node builds its managers' configs where it runs (its temp directory, say): it is
    sent the fields that differ from the defaults, and gpu: false as no GPU manager."""
    from arl_tangram.runtime.ray_executor import RayExecutor

    p = tmp_path / "c.yaml"
    p.write_text("nodes:\n  - name: a\n    cpu: {warm_max: 7}\n    gpu: false\n")
    ex = RayExecutor.from_service_config(load_service_config(p))
    assert ex.config.cpu == {"warm_max": 7, "hidden_paths": (str(p.resolve()),)}
    assert ex.config.gpu is None


def test_the_served_policies_are_the_cores_but_the_static_pool_baseline() -> None:
    from arl_tangram.core.config import POLICIES
    from arl_tangram.runtime.config import POLICY_NAMES

    assert POLICY_NAMES == ("tangram", "trajectory-bound", "task-isolated", "fifo")
    assert set(POLICIES) - set(POLICY_NAMES) == {"static-pool"}


def test_the_service_config_parses_without_the_gpu_stack() -> None:
    """The node's ``gpu:`` section is a `GpuManagerConfig` built at parse time: reading the
    config imports neither torch nor the GPU manager (the ``[gpu]`` extra may be absent)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c",
         "import sys; from arl_tangram.runtime.config import parse_service_config as p; "
         "c = p({'nodes': [{'gpu': {'device': 'cpu'}}]}); "
         "print(c.nodes[0].gpu.device, [m for m in ('torch', 'arl_tangram.managers.gpu.manager')"
         " if m in sys.modules])"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "cpu []"
