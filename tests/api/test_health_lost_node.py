"""`GET /v1/health`'s rule (issue 25): ready while there is a node and every node that is not
lost is ready. A lost node (Ray: its machine or agent died; nothing is placed there any more) is
listed as lost and not ready but does not hold the service down; a live node that is not ready
does, with its reason."""

from __future__ import annotations

import json
from typing import Any

from arl_tangram.api.app import _health
from arl_tangram.core.resources import Resources
from arl_tangram.core.view import NodeView
from arl_tangram.runtime.views import ClusterView, NodeRow


class _Eng:
    """The engine's cluster view of nodes given as their ``alive`` (the core's) and their own
    report (``ready``, ``not_ready_reason``)."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes = list(nodes)

    def cluster_view(self) -> ClusterView:
        rows = tuple(NodeRow(core=NodeView(n["name"], "default", Resources(), Resources(),
                                           Resources(), 0, n["alive"], {}),
                             report={k: v for k, v in n.items() if k not in ("name", "alive")})
                     for n in self.nodes)
        return ClusterView(nodes=rows, policy="tangram", models=(), instances=(),
                           models_down={}, sessions=0)


def _body(*nodes: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = _health(_Eng(*nodes))  # type: ignore[arg-type]
    return r.status_code, json.loads(bytes(r.body))


def test_a_lost_node_is_listed_but_does_not_hold_the_service_down() -> None:
    code, body = _body({"name": "a", "alive": False}, {"name": "a~1", "alive": True, "ready": True})
    assert code == 200 and body["ready"] is True
    assert body["nodes"]["a"] == {"ready": False, "lost": True, "reason": "the node is lost"}
    assert body["nodes"]["a~1"] == {"ready": True}


def test_a_live_node_not_ready_holds_it_down_and_only_lost_nodes_mean_none() -> None:
    code, body = _body({"name": "a", "alive": False},
                       {"name": "b", "alive": True, "ready": False, "not_ready_reason": "why"})
    assert code == 503 and body["reason"] == "b: why"
    code, body = _body({"name": "a", "alive": False})
    assert code == 503 and body["reason"] == "no node"
    code, body = _body()
    assert code == 503 and body["reason"] == "no node"
