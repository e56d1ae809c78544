"""A node's image calls on Ray, typed (issue 36, item 2): one `NodeAgent` method per operation,
each answering its value or a `RemoteError` (a picklable kind and message, raised again on the
driver as the same class). Run here in-process: the agents' handles are plain objects whose
``method.remote(...)`` calls the agent, so the driver side (`RayExecutor`'s image operations)
and the peer side (`RayPeer`) run too, without a Ray cluster."""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any

import pytest

from arl_tangram.core.errors import (
    ImageError,
    ImageInUse,
    ImagesUnsupported,
    ImageTooLarge,
    InvalidAction,
)
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageStore
from arl_tangram.runtime.images import ErrorKind, Fetched, PeersSet, RemoteError, unwrap
from arl_tangram.runtime.node import NodeHost
from arl_tangram.runtime.ray_agent import AgentSetup, EchoHost, NodeAgent
from arl_tangram.runtime.ray_executor import RayExecutor, _Node, _State


@pytest.mark.parametrize(("exc", "kind", "cls"), [
    (ImageError("gone"), ErrorKind.IMAGE, ImageError),
    (ValueError("gone"), ErrorKind.IMAGE, ImageError),
    (ImageInUse("gone"), ErrorKind.IN_USE, ImageInUse),
    (ImageTooLarge("gone"), ErrorKind.TOO_LARGE, ImageTooLarge),
    (ImagesUnsupported("gone"), ErrorKind.UNSUPPORTED, ImagesUnsupported),
])
def test_an_error_travels_as_its_kind_and_is_raised_as_its_class(exc, kind, cls) -> None:
    err = RemoteError.of(exc)
    assert err == RemoteError(kind, "gone")
    assert pickle.loads(pickle.dumps(err)) == err
    with pytest.raises(cls) as got:
        unwrap(err, "n1")
    assert type(got.value) is cls and str(got.value) == "node n1: gone"


def test_an_invalid_name_stays_invalid() -> None:
    err = RemoteError.of(InvalidAction("name", "bad"))
    assert err == RemoteError(ErrorKind.INVALID, "name: bad")
    with pytest.raises(InvalidAction) as got:
        unwrap(err, "n1")
    assert str(got.value) == "name: node n1: name: bad" and got.value.field == "name"


def test_values_pass_and_answers_render_as_before() -> None:
    assert unwrap(3, "n1") == 3 and unwrap(False, "n1") is False
    assert PeersSet(True, ("a", "b")).to_dict() == {"held": True, "peers": ["a", "b"]}
    assert Fetched().to_dict() == {} and not Fetched()
    assert Fetched(0.5).to_dict() == {"image_import_s": 0.5} and Fetched(0.5)
    assert Fetched(0.5, {"from": "a"}).to_dict() == {"image_import_s": 0.5,
                                                     "image_pull": {"from": "a"}}


class _Cpu:
    """The CPU manager as far as images go: its cache."""

    def __init__(self, root: str) -> None:
        self.images = ImageStore(root)

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def health(self) -> dict:
        return {"ready": True}


class _Remote:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class _Handle:
    """An agent as its Ray handle looks: ``handle.method.remote(...)`` awaits the method."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self.agent, name))


def _agent(name: str, tmp_path) -> NodeAgent:
    def factory(setup: AgentSetup, emit: Any) -> NodeHost:
        return NodeHost(setup.name, emit=emit,
                        cpu_manager=_Cpu(str(tmp_path / setup.name)))  # type: ignore[arg-type]

    return NodeAgent(AgentSetup(name=name, ray_node_id=f"r-{name}", host_factory=factory,
                                image_chunk_bytes=1 << 16))


@pytest.fixture()
def image(tmp_path) -> str:
    top = tmp_path / "top"
    (top / "etc").mkdir(parents=True)
    (top / "etc" / "which").write_text("one")
    imagekit.pack_layer(str(top), str(tmp_path / "one.tar"))
    return imagekit.write_oci_layout(str(tmp_path / "oci"), [str(tmp_path / "one.tar")], {})


@pytest.mark.needs_root  # (layers keep owners)
async def test_each_operation_answers_its_value_or_its_error(tmp_path, image) -> None:
    a, echo = _agent("a", tmp_path), NodeAgent(AgentSetup(name="e", ray_node_id="r-e",
                                                         host_factory=EchoHost))
    await a.start()
    await echo.start()
    try:
        assert await echo.image_users("one") == RemoteError(ErrorKind.UNSUPPORTED,
                                                            "node e: no image cache")
        assert await a.image_readable(image) is True
        assert await a.image_readable("rel/path") is False
        rec = await a.image_import(image, "one")
        assert rec["name"] == "one" and rec["layers"]
        assert await a.image_users("one") == 0
        assert [i["name"] for i in await a.image_list()] == ["one"]
        assert (await a.image_manifest("one"))["digest"] == rec["digest"]
        missing = await a.image_manifest("nope")
        assert isinstance(missing, RemoteError) and missing.kind is ErrorKind.IMAGE
        bad = await a.image_source("Bad Name!", image)
        assert isinstance(bad, RemoteError) and bad.kind is ErrorKind.IMAGE
        assert await a.image_source("two", image) == {"path": image, "held": False, "lazy": True}
        assert await a.image_remove("one") is True
        assert await a.image_remove("one") is False
        got = await a.image_import(str(tmp_path / "missing.tar"), "three")
        assert isinstance(got, RemoteError) and got.kind is ErrorKind.IMAGE
    finally:
        await a.shutdown()
        await echo.shutdown()


@pytest.mark.needs_root
async def test_the_driver_imports_sends_and_replicates_over_typed_calls(
        tmp_path, image, caplog) -> None:
    agents = {n: _agent(n, tmp_path) for n in ("a", "b", "c")}
    agents["e"] = NodeAgent(AgentSetup(name="e", ray_node_id="r-e", host_factory=EchoHost))
    ex = RayExecutor()
    for name, agent in agents.items():
        await agent.start()
        node = _Node(name, f"r-{name}", _Handle(agent), _State.UP)
        ex._nodes[name], ex._current[f"r-{name}"] = node, node
    try:
        with pytest.raises(ImagesUnsupported, match=r"^node e: node e: no image cache$"):
            await ex.image_call(lambda h: h.image_users.remote("one"))
        with pytest.raises(InvalidAction, match="unknown node 'z'"):
            await ex.image_call(lambda h: h.image_users.remote("one"), "z")
        caplog.set_level(logging.WARNING, logger="arl_tangram.runtime.ray_executor")
        out = await ex.import_image(image, "one", node="a")
        assert out["imported_on"] == "a" and out["holders"] == ["a"]
        assert "node e: could not be told the holders of image one: node e: no image cache" \
            in caplog.text
        assert await agents["b"].image_peers("one", [("a", None), ("b", None)]) == \
            PeersSet(False, ("a",))
        ex.image_holders["one"] = {"a"}
        await ex._push_peers("one")  # (the handles again, not the placeholder above)
        rep = await ex.replicate_image("one", node="b")
        pull = rep["nodes"]["b"]["image_pull"]
        assert rep["nodes"]["b"]["image_import_s"] > 0
        assert (pull["from"], pull["layers_sent"], pull["layers_had"]) == ("a", 1, 0)
        assert (await agents["b"].image_pull("one")) == Fetched()  # held now
        none = await agents["c"].image_pull("zzz")
        assert none == RemoteError(ErrorKind.IMAGE, "node c: no source or peer of image 'zzz'")
        # an archive only the driver reads, sent to a node in chunks
        tar = str(tmp_path / "sent.tar")
        imagekit.pack_layer(str(tmp_path / "top"), tar)
        sent = await ex.upload_image(tar, "sent", node="c")
        assert sent["uploaded"] is True and sent["imported_on"] == "c"
        bad = str(tmp_path / "bad.tar")
        with open(bad, "wb") as f:
            f.write(os.urandom(1000))
        with pytest.raises(ImageError, match=r"^node c: "):
            await ex.upload_image(bad, "bad", node="c")
        # removal: counted everywhere first, then removed; a node's holders told
        assert await ex.remove_image("one", node="b") == {"name": "one", "removed": ["b"]}
        assert ex.image_holders["one"] == {"a"}
        with pytest.raises(ImagesUnsupported, match=r"^node e: "):
            await ex.remove_image("one")
        with pytest.raises(ImageInUse) as busy:
            unwrap(RemoteError.of(ImageInUse("busy")), "c")
        assert str(busy.value) == "node c: busy"
    finally:
        for agent in agents.values():
            await agent.shutdown()


def test_the_real_host_is_told_its_chunk_size_and_peers() -> None:
    from arl_tangram.runtime.ray_agent import make_node_host

    setup = AgentSetup(name="x", ray_node_id="r-x", image_chunk_bytes=1234,
                       image_peers=(("one", (("a", None), ("x", None))),))
    host = make_node_host(setup, lambda e: None)
    assert host.images is not None and host.images.pulls.chunk_bytes == 1234
    assert [p.name for p in host.images.pulls.peers["one"]] == ["a"]
