"""The public API is explicit: `arl_tangram.__all__` names exactly what it re-exports."""

import arl_tangram
import arl_tangram.client


def test_top_level_all() -> None:
    assert sorted(arl_tangram.__all__) == ["AsyncClient", "Client", "__version__"]
    for name in arl_tangram.__all__:
        assert getattr(arl_tangram, name) is not None
    assert arl_tangram.Client is arl_tangram.client.Client
    assert arl_tangram.AsyncClient is arl_tangram.client.AsyncClient


def test_sync_and_async_twins_mirror() -> None:
    from arl_tangram.client import AsyncClient, Client

    public = {n for n in dir(AsyncClient) if not n.startswith("_")}
    mirrored = {n for n in dir(Client) if not n.startswith("_")}
    assert public - {"aclose"} == mirrored - {"close", "engine"} | (public & {"engine"}) - {"aclose"}
    assert "aclose" in public and "close" in mirrored
