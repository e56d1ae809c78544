"""Images between nodes at the NodeHost (issue 26, item 3), without Ray: a node that lacks an
image pulls it from a peer node (`runtime.images.HostPeer` over another NodeHost's cache), only
the layers it lacks travel, concurrent first uses share one pull, a failing peer is passed over
for the next, and the transfer's progress and time are reported (``info()`` and what
`NodeImages.ensure` hands the first action's result)."""

from __future__ import annotations

import asyncio
import os

import pytest

from arl_tangram.core.errors import ImageError
from arl_tangram.core.events import WarmPoolReport
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageStore
from arl_tangram.runtime.images import HostPeer, ImagePeer, PeersSet
from arl_tangram.runtime.node import NodeHost

pytestmark = pytest.mark.needs_root  # (layers keep owners)


class _Cpu:
    """The CPU manager as far as images go: its cache."""

    def __init__(self, root: str) -> None:
        self.images = ImageStore(root)

    def health(self) -> dict:
        return {"ready": True}


def host(name: str, tmp_path, events: list) -> NodeHost:
    h = NodeHost(name, emit=events.append, cpu_manager=_Cpu(str(tmp_path / name)))  # type: ignore[arg-type]
    h.images.pulls.chunk_bytes = 1 << 16
    return h


async def ensure(h: NodeHost, name: str) -> dict:
    return (await h.images.ensure(name)).to_dict()


@pytest.fixture()
def images(tmp_path) -> dict[str, str]:
    """Two OCI images sharing their base layer (~400 kB), each with a small top layer."""
    base = tmp_path / "base"
    (base / "opt").mkdir(parents=True)
    (base / "opt" / "big.bin").write_bytes(os.urandom(400_000))
    imagekit.pack_layer(str(base), str(tmp_path / "base.tar"))
    out = {}
    for name in ("one", "two"):
        top = tmp_path / f"top-{name}"
        (top / "etc").mkdir(parents=True)
        (top / "etc" / "which").write_text(name)
        imagekit.pack_layer(str(top), str(tmp_path / f"{name}.tar"))
        out[name] = imagekit.write_oci_layout(
            str(tmp_path / f"oci-{name}"), [str(tmp_path / "base.tar"), str(tmp_path / f"{name}.tar")],
            {"Env": [f"IMG={name}"]})
    return out


async def test_a_node_pulls_only_the_layers_it_lacks(tmp_path, images, caplog) -> None:
    caplog.set_level("INFO", logger="arl_tangram.runtime.images")
    ev_a: list = []
    ev_b: list = []
    a, b = host("a", tmp_path, ev_a), host("b", tmp_path, ev_b)
    for name, path in images.items():
        await a.images.import_(path, name)
    for name in images:
        assert b.images.set_peers(name, [HostPeer(a.images.server), HostPeer(b.images.server)]) \
            == PeersSet(False, ("a",))
    note = await ensure(b, "one")
    pull = note["image_pull"]
    assert note["image_import_s"] > 0 and pull["from"] == "a" and pull["s"] > 0
    assert (pull["layers_sent"], pull["layers_had"]) == (2, 0)
    assert pull["bytes"] > 400_000
    assert a.images.server.served == {"layers": 2, "bytes": pull["bytes"]}
    one_a, one_b = a.images.server.manifest("one"), b.images.server.manifest("one")
    assert (one_b["digest"], one_b["layers"], one_b["config"]) == \
        (one_a["digest"], one_a["layers"], one_a["config"])
    assert one_b["source"] == "node a"
    assert any(isinstance(e, WarmPoolReport) and e.key == "image:one" and e.warm == 1 for e in ev_b)
    # the second image shares the base layer: only its top layer travels
    pull2 = (await ensure(b, "two"))["image_pull"]
    assert (pull2["layers_sent"], pull2["layers_had"]) == (1, 1)
    assert 0 < pull2["bytes"] < 100_000
    assert a.images.server.served == {"layers": 3, "bytes": pull["bytes"] + pull2["bytes"]}
    info = b.info()
    assert [(t["image"], t["state"], t["layers_sent"]) for t in info["image_transfers"]] == \
        [("one", "done", 2), ("two", "done", 1)]
    assert info["image_peers"] == {"one": ["a"], "two": ["a"]}
    assert await ensure(b, "one") == {}  # held now: nothing to wait for
    lines = [r.getMessage() for r in caplog.records]
    assert "node b: pulling image two from node a: 1 of 2 layers missing" in "\n".join(lines)
    assert any(x.startswith("node b: pulled image two from node a in ") for x in lines)
    assert not a.images.server.streams  # every stream closed


async def test_first_uses_at_once_share_one_pull(tmp_path, images) -> None:
    a, c = host("a", tmp_path, []), host("c", tmp_path, [])
    await a.images.import_(images["one"], "one")
    c.images.set_peers("one", [HostPeer(a.images.server)])
    notes = await asyncio.gather(*(ensure(c, "one") for _ in range(4)))
    assert all(n["image_pull"]["layers_sent"] == 2 for n in notes)
    assert a.images.server.served["layers"] == 2  # each layer was sent once


class _Broken(ImagePeer):
    name = "broken"

    async def manifest(self, image: str) -> dict:
        raise ImageError(f"no image {image!r} here")

    async def open_layer(self, key: str, chunk_bytes: int) -> str:
        raise AssertionError

    async def next_chunk(self, stream: str) -> bytes:
        raise AssertionError

    async def close_layer(self, stream: str) -> dict:
        raise AssertionError


class _Liar(HostPeer):
    """Sends the layer's chunks with one byte altered."""

    name = "liar"

    async def next_chunk(self, stream: str) -> bytes:
        chunk = await super().next_chunk(stream)
        return chunk[:-1] + bytes([chunk[-1] ^ 1]) if chunk else chunk


async def test_a_failing_peer_is_passed_over_and_all_failing_is_an_error(tmp_path, images) -> None:
    a, b = host("a", tmp_path, []), host("b", tmp_path, [])
    await a.images.import_(images["one"], "one")
    liar = _Liar(a.images.server)
    b.images.set_peers("one", [_Broken(), liar])
    with pytest.raises(ImageError, match="could not be pulled") as exc:
        await ensure(b, "one")
    assert "from node broken" in str(exc.value) and "altered or cut" in str(exc.value)
    assert not b.images.has("one") and os.listdir(b.images.store().tmp_dir) == []  # type: ignore[attr-defined]
    assert b.info()["image_transfers"][-1]["state"] == "failed"
    b.images.set_peers("one", [_Broken(), HostPeer(a.images.server)])
    pull = (await ensure(b, "one"))["image_pull"]
    assert pull["from"] == "a" and b.images.has("one")


async def test_without_peers_a_known_path_is_imported(tmp_path, images) -> None:
    b = host("b", tmp_path, [])
    assert await ensure(b, "one") == {}  # nothing known: the manager will say it
    b.images.add_source("one", images["one"])
    note = await ensure(b, "one")
    assert note["image_import_s"] > 0 and "image_pull" not in note and b.images.has("one")
