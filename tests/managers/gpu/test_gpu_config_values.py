"""Exact values of managers/gpu/config.py (issue 43 item 2): every default of
`GpuManagerConfig`, each rule's edge accepted and the value past it refused with the whole
message word for word, NVLink domains normalised to tuples of ints, and the boundary records'
fields and defaults."""

from __future__ import annotations

import dataclasses

import pytest

from arl_tangram.managers.gpu.config import BatchOutcome, DeviceInfo, GpuManagerConfig


def _refused(**kw: object) -> str:
    with pytest.raises(ValueError) as exc:
        GpuManagerConfig(**kw)  # type: ignore[arg-type]
    return str(exc.value)


def test_defaults() -> None:
    c = GpuManagerConfig()
    assert [(f.name, getattr(c, f.name)) for f in dataclasses.fields(c)] == [
        ("device", "auto"),
        ("cpu_devices", 2),
        ("threads_per_device", 1),
        ("cpu_device_memory_mb", 4096.0),
        ("nvlink_domains", None),
        ("host_park_limit_mb", 16384.0),
        ("max_batch_tokens", 16384),
        ("max_length", 512),
        ("batch_wait_ms", 5.0),
        ("pin_host_memory", True),
        ("forward_timeout_s", 60.0),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.device = "cpu"  # type: ignore[misc]
    with pytest.raises(TypeError):
        GpuManagerConfig("cpu")  # type: ignore[misc]  # keyword-only


@pytest.mark.parametrize("device", ["auto", "cuda", "cpu"])
def test_each_device_is_accepted(device: str) -> None:
    assert GpuManagerConfig(device=device).device == device


def test_an_unknown_device_is_refused_word_for_word() -> None:
    assert _refused(device="tpu") == (
        "GpuManagerConfig.device must be one of ('auto', 'cuda', 'cpu'), got 'tpu'"
    )
    assert _refused(device="CPU") == (
        "GpuManagerConfig.device must be one of ('auto', 'cuda', 'cpu'), got 'CPU'"
    )


@pytest.mark.parametrize(
    "name", ["cpu_devices", "threads_per_device", "max_batch_tokens", "max_length"]
)
def test_integers_at_least_one(name: str) -> None:
    assert getattr(GpuManagerConfig(**{name: 1}), name) == 1
    assert _refused(**{name: 0}) == f"GpuManagerConfig.{name} must be an integer >= 1, got 0"
    assert _refused(**{name: -3}) == f"GpuManagerConfig.{name} must be an integer >= 1, got -3"
    assert _refused(**{name: 2.0}) == f"GpuManagerConfig.{name} must be an integer >= 1, got 2.0"
    assert _refused(**{name: "4"}) == f"GpuManagerConfig.{name} must be an integer >= 1, got '4'"


def test_forward_timeout_must_be_a_positive_number() -> None:
    assert GpuManagerConfig(forward_timeout_s=1e-6).forward_timeout_s == 1e-6
    assert GpuManagerConfig(forward_timeout_s=3).forward_timeout_s == 3
    msg = "GpuManagerConfig.forward_timeout_s must be a number > 0, got {}"
    assert _refused(forward_timeout_s=0) == msg.format("0")
    assert _refused(forward_timeout_s=0.0) == msg.format("0.0")
    assert _refused(forward_timeout_s=-1.0) == msg.format("-1.0")
    assert _refused(forward_timeout_s="5") == msg.format("'5'")
    assert _refused(forward_timeout_s=None) == msg.format("None")
    assert _refused(forward_timeout_s=float("nan")) == msg.format("nan")


@pytest.mark.parametrize("name", ["cpu_device_memory_mb", "host_park_limit_mb", "batch_wait_ms"])
def test_numbers_at_least_zero(name: str) -> None:
    assert getattr(GpuManagerConfig(**{name: 0}), name) == 0
    assert getattr(GpuManagerConfig(**{name: 0.0}), name) == 0.0
    assert getattr(GpuManagerConfig(**{name: 7}), name) == 7
    assert _refused(**{name: -0.5}) == f"GpuManagerConfig.{name} must be a number >= 0, got -0.5"
    assert _refused(**{name: -1}) == f"GpuManagerConfig.{name} must be a number >= 0, got -1"
    assert _refused(**{name: "1"}) == f"GpuManagerConfig.{name} must be a number >= 0, got '1'"
    assert _refused(**{name: None}) == f"GpuManagerConfig.{name} must be a number >= 0, got None"


def test_the_first_rule_broken_is_the_one_named() -> None:
    assert _refused(device="x", cpu_devices=0).startswith("GpuManagerConfig.device ")
    assert _refused(cpu_devices=0, max_length=0).startswith("GpuManagerConfig.cpu_devices ")
    assert _refused(max_length=0, forward_timeout_s=0).startswith("GpuManagerConfig.max_length ")
    assert _refused(forward_timeout_s=0, batch_wait_ms=-1).startswith(
        "GpuManagerConfig.forward_timeout_s "
    )
    assert _refused(batch_wait_ms=-1, nvlink_domains=((0, 0),)).startswith(
        "GpuManagerConfig.batch_wait_ms "
    )


def test_nvlink_domains_become_tuples_of_ints() -> None:
    c = GpuManagerConfig(nvlink_domains=[[0, "1"], (2.0,), []])  # type: ignore[arg-type]
    assert c.nvlink_domains == ((0, 1), (2,), ())
    assert all(type(d) is int for dom in c.nvlink_domains for d in dom)
    assert type(c.nvlink_domains) is tuple
    assert all(type(dom) is tuple for dom in c.nvlink_domains)
    assert GpuManagerConfig(nvlink_domains=((3,), (0, 1))).nvlink_domains == ((3,), (0, 1))
    assert GpuManagerConfig(nvlink_domains=()).nvlink_domains == ()


def test_nvlink_domains_refused_word_for_word() -> None:
    msg = "GpuManagerConfig.nvlink_domains must list each device index >= 0 once, got {}"
    assert _refused(nvlink_domains=((0, 1), (1, 2))) == msg.format("((0, 1), (1, 2))")
    assert _refused(nvlink_domains=((0, 0),)) == msg.format("((0, 0),)")
    assert _refused(nvlink_domains=[[0], [-1]]) == msg.format("[[0], [-1]]")
    assert _refused(nvlink_domains=((-2,),)) == msg.format("((-2,),)")


def test_records() -> None:
    d = DeviceInfo(3, "cpu", 512.0, 1)
    assert (d.index, d.kind, d.memory_mb, d.domain, d.threads, d.name) == (
        3,
        "cpu",
        512.0,
        1,
        0,
        "",
    )
    b = BatchOutcome()
    assert (dict(b.outputs), dict(b.failed), b.latency_s, b.batch_size) == ({}, {}, 0.0, 0)
    assert BatchOutcome().outputs is not b.outputs
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.index = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.batch_size = 1  # type: ignore[misc]
    assert not hasattr(d, "__dict__") and not hasattr(b, "__dict__")
