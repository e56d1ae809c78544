"""One small real Ray cluster (``ray.cluster_utils.Cluster``) shared by every test here.

Three nodes with their own resources: the head (1 CPU) and two workers (2 CPUs each, one with
topology labels and a custom resource). Tests that add or remove nodes add their own extra nodes
and remove only those, so the three base nodes stay for the other tests.
"""

from __future__ import annotations

import os

import pytest
from _ray_helpers import OBJECT_STORE

ray = pytest.importorskip("ray")

os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")


@pytest.fixture(scope="package")
def ray_cluster():
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
    yield cluster
    ray.shutdown()
    cluster.shutdown()
