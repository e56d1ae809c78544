"""One small real Ray cluster (``ray.cluster_utils.Cluster``) shared by the tests of this folder.

Three nodes with their own resources: the head (1 CPU) and two workers (2 CPUs each, one with a
label and a custom resource). Tests that add or remove nodes add their own extra nodes and
remove only those, so the three base nodes stay for the other tests. The cluster is started by
the first test that asks for it and shut down after the last test of this folder, so it does
not idle through the rest of the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _ray_helpers import OBJECT_STORE

# (tests/conftest.py keeps Ray on the loopback address and without usage stats)
ray = pytest.importorskip("ray")

_HERE = Path(__file__).parent
_LIVE: dict[str, object] = {}


def _start():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False,
                        "object_store_memory": OBJECT_STORE, "memory": 2 * 2**30},
    )
    cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE, memory=3 * 2**30,
                     labels={"tangram.io/pool": "sandbox"})
    cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE, memory=3 * 2**30,
                     resources={"tangram_disk_gb": 50.0},
                     labels={"tangram.io/pool": "sandbox", "zone": "b"})
    ray.init(address=cluster.address, namespace="tangram-tests", log_to_driver=False)
    return cluster


@pytest.fixture
def ray_cluster():
    if "cluster" not in _LIVE:
        _LIVE["cluster"] = _start()
    return _LIVE["cluster"]


def pytest_runtest_teardown(item, nextitem):
    if "cluster" in _LIVE and (nextitem is None or _HERE not in Path(nextitem.path).parents):
        cluster = _LIVE.pop("cluster")
        ray.shutdown()
        cluster.shutdown()
