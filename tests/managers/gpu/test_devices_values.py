"""Exact values of managers/gpu/devices.py (issue 43 item 2), without a GPU: torch.cuda's
answers are replaced (availability, count, peer access, properties), so the CUDA paths run
here too -- the kind chosen, peer-access domains as connected components, a configured
topology completed with singletons or refused word for word, and every device's record."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu import devices
from arl_tangram.managers.gpu.config import DeviceInfo, GpuManagerConfig
from arl_tangram.managers.gpu.devices import _peer_domains, discover, resolve_kind, torch_device


def _cuda(monkeypatch: Any, n: int | None, peers: set[tuple[int, int]] = frozenset()) -> list:
    """torch.cuda as a node with ``n`` devices (None: no CUDA) and these peer pairs."""
    calls: list[tuple[int, int]] = []

    def peer(i: int, j: int) -> bool:
        calls.append((i, j))
        return (i, j) in peers or (j, i) in peers

    def props(i: int) -> Any:
        return SimpleNamespace(total_memory=(i + 1) * 3 * 2**29, name=f"Fake GPU {i}")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n or 0)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", peer)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    return calls


# -- resolve_kind ---------------------------------------------------------------------------------


def test_kind_without_cuda(monkeypatch: Any) -> None:
    _cuda(monkeypatch, None)
    assert resolve_kind(GpuManagerConfig(device="auto")) == "cpu"
    assert resolve_kind(GpuManagerConfig(device="cpu")) == "cpu"
    with pytest.raises(BrokenError) as exc:
        resolve_kind(GpuManagerConfig(device="cuda"))
    assert str(exc.value) == (
        "GpuManagerConfig.device='cuda' but torch.cuda.is_available() is False"
    )


def test_kind_with_cuda(monkeypatch: Any) -> None:
    _cuda(monkeypatch, 2)
    assert resolve_kind(GpuManagerConfig(device="auto")) == "cuda"
    assert resolve_kind(GpuManagerConfig(device="cuda")) == "cuda"
    assert resolve_kind(GpuManagerConfig(device="cpu")) == "cpu"


# -- _peer_domains --------------------------------------------------------------------------------


def test_peer_domains_are_connected_components(monkeypatch: Any) -> None:
    calls = _cuda(monkeypatch, 6, {(0, 2), (2, 4), (1, 5)})
    assert _peer_domains(6) == ((0, 2, 4), (1, 5), (3,))
    assert calls == [(i, j) for i in range(6) for j in range(i + 1, 6)]  # each pair once


def test_peer_domains_join_through_a_chain(monkeypatch: Any) -> None:
    # joined last to first: each join must find the roots, not the devices themselves
    _cuda(monkeypatch, 5, {(3, 4), (2, 4), (1, 3), (0, 4)})
    assert _peer_domains(5) == ((0, 1, 2, 3, 4),)
    _cuda(monkeypatch, 6, {(4, 5), (3, 5), (2, 4), (1, 3), (0, 2)})
    assert _peer_domains(6) == ((0, 1, 2, 3, 4, 5),)
    _cuda(monkeypatch, 4, {(0, 3), (1, 2), (2, 3)})
    assert _peer_domains(4) == ((0, 1, 2, 3),)
    _cuda(monkeypatch, 4, set())
    assert _peer_domains(4) == ((0,), (1,), (2,), (3,))
    _cuda(monkeypatch, 4, {(1, 3)})
    assert _peer_domains(4) == ((0,), (1, 3), (2,))


# -- discover -------------------------------------------------------------------------------------


def test_cpu_devices_share_one_domain(monkeypatch: Any) -> None:
    _cuda(monkeypatch, None)
    cfg = GpuManagerConfig(
        device="auto", cpu_devices=3, threads_per_device=2, cpu_device_memory_mb=1000.0
    )
    devs, doms = discover(cfg)
    assert doms == ((0, 1, 2),)
    assert devs == [DeviceInfo(i, "cpu", 1000.0, 0, 2, "cpu") for i in range(3)]


def test_cpu_devices_ignore_cuda_present(monkeypatch: Any) -> None:
    calls = _cuda(monkeypatch, 4, {(0, 1)})
    devs, doms = discover(GpuManagerConfig(device="cpu", cpu_devices=2))
    assert doms == ((0, 1),)
    assert devs == [DeviceInfo(i, "cpu", 4096.0, 0, 1, "cpu") for i in range(2)]
    assert calls == []


def test_cuda_devices_from_their_properties_and_peer_domains(monkeypatch: Any) -> None:
    _cuda(monkeypatch, 3, {(0, 2)})
    devs, doms = discover(GpuManagerConfig(device="auto", threads_per_device=4))
    assert doms == ((0, 2), (1,))
    assert devs == [
        DeviceInfo(0, "cuda", 1536.0, 0, 0, "Fake GPU 0"),
        DeviceInfo(1, "cuda", 3072.0, 1, 0, "Fake GPU 1"),
        DeviceInfo(2, "cuda", 4608.0, 0, 0, "Fake GPU 2"),
    ]


def test_two_cuda_devices_are_asked_about_peer_access(monkeypatch: Any) -> None:
    calls = _cuda(monkeypatch, 2)
    devs, doms = discover(GpuManagerConfig(device="cuda"))
    assert doms == ((0,), (1,))
    assert [d.domain for d in devs] == [0, 1]
    assert calls == [(0, 1)]
    _cuda(monkeypatch, 2, {(0, 1)})
    assert discover(GpuManagerConfig(device="cuda"))[1] == ((0, 1),)


def test_one_cuda_device_asks_no_peers_and_none_gives_nothing(monkeypatch: Any) -> None:
    calls = _cuda(monkeypatch, 1)
    devs, doms = discover(GpuManagerConfig(device="cuda"))
    assert doms == ((0,),)
    assert devs == [DeviceInfo(0, "cuda", 1536.0, 0, 0, "Fake GPU 0")]
    assert calls == []
    _cuda(monkeypatch, 0)
    assert discover(GpuManagerConfig(device="cuda")) == ([], ())


def test_configured_domains_come_first_then_singletons(monkeypatch: Any) -> None:
    calls = _cuda(monkeypatch, 5, {(0, 1), (1, 2), (2, 3), (3, 4)})
    devs, doms = discover(GpuManagerConfig(device="cuda", nvlink_domains=((3, 1), (0,))))
    assert doms == ((3, 1), (0,), (2,), (4,))
    assert [d.domain for d in devs] == [1, 0, 2, 0, 3]
    assert calls == []  # the configuration is not checked against peer access
    _cuda(monkeypatch, None)
    devs, doms = discover(GpuManagerConfig(device="cpu", cpu_devices=2, nvlink_domains=((1, 0),)))
    assert doms == ((1, 0),)
    assert [(d.index, d.domain) for d in devs] == [(0, 0), (1, 0)]
    devs, doms = discover(GpuManagerConfig(device="cpu", cpu_devices=2, nvlink_domains=()))
    assert doms == ((0,), (1,))


def test_configured_domains_naming_a_missing_device_are_refused(monkeypatch: Any) -> None:
    _cuda(monkeypatch, None)
    with pytest.raises(ValueError) as exc:
        discover(GpuManagerConfig(device="cpu", cpu_devices=2, nvlink_domains=((0, 3, 2),)))
    assert str(exc.value) == "GpuManagerConfig.nvlink_domains names device 3 but the node has 2"
    with pytest.raises(ValueError) as exc:
        discover(GpuManagerConfig(device="cpu", cpu_devices=2, nvlink_domains=((2,),)))
    assert str(exc.value) == "GpuManagerConfig.nvlink_domains names device 2 but the node has 2"
    devs, _ = discover(GpuManagerConfig(device="cpu", cpu_devices=2, nvlink_domains=((1,),)))
    assert len(devs) == 2


def test_torch_device() -> None:
    assert torch_device(DeviceInfo(3, "cuda", 1.0, 0)) == torch.device("cuda:3")
    assert torch_device(DeviceInfo(0, "cuda", 1.0, 0)) == torch.device("cuda", 0)
    assert torch_device(DeviceInfo(3, "cpu", 1.0, 0)) == torch.device("cpu")
    assert devices.torch_device is torch_device
