"""The embedded replay backend takes every policy label `tangram simulate` takes: a static pool's
size rides in the label (the core is built from it), not in the engine's config."""

from __future__ import annotations

import pytest

from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay.backends import EmbeddedBackend


@pytest.mark.parametrize(("label", "policy"), [("static-pool:1", "static-pool"),
                                               ("static-pool:8", "static-pool"),
                                               ("tangram", "tangram"), ("fifo", "fifo")])
def test_every_label_builds_an_engine(label: str, policy: str) -> None:
    cluster = ClusterSpec((NodeSpec("local", Resources(cpu=2, memory_mb=4096)),), ())
    b = EmbeddedBackend(cluster, label, 1, {})
    assert b.engine.config.policy == policy
