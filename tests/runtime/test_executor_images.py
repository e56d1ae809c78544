"""Image operations are part of the Executor seam: an executor whose nodes keep no image cache
keeps the ABC's defaults (ImagesUnsupported; ``has_image`` cannot tell), and the engine reaches
them through its own methods (the API never reads ``engine._executor``)."""

from __future__ import annotations

import pytest
from fakes import FakeExecutor

from arl_tangram.core.errors import ImagesUnsupported
from arl_tangram.runtime.engine import Engine


async def test_an_executor_without_images_says_so_through_the_engine() -> None:
    eng = Engine(FakeExecutor())
    with pytest.raises(ImagesUnsupported):
        await eng.import_image("/tmp/x.tar", "x")
    with pytest.raises(ImagesUnsupported):
        eng.list_images()
    with pytest.raises(ImagesUnsupported):
        await eng.remove_image("x")
    assert eng.has_image("x") is None
