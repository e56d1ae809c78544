# mypy: disable-error-code="misc"
"""Partitions of the static baselines: trajectory slices and task pools (CPU only).

Invariant: the quotas of a node's pieces add up to its CPU; what a partition has in use on a
node (``part_used``) is the sum of the CPU allotments of the actions it placed there, and the
per-partition index (``part_index``) buckets its pieces by free quota. A piece smaller than an
action's demand runs it, alone, at the piece's quota (fractional CPU runs proportionally
slower); ``one_at_a_time`` partitions run one action at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import trait

from .actions import ActionSpec
from .nodeindex import FreeIndex
from .policies import cpu_nodes, split_cpu, trajectory_of
from .records import ActionRecord, SessionRecord
from .resources import CPU

if TYPE_CHECKING:
    from .core import Core


@trait  # (a part of `Core`: mypyc compiles it into that class; see `_native.py`)
class PartitionMixin:
    """Part of `Core`: the trajectory-bound and task-isolated partitions."""

    partitions: dict[str, list[tuple[str, float]]]  # partition -> pieces (node, cpu quota)
    part_by_node: dict[str, list[str]]  # node -> partitions with a piece on it
    part_quota: dict[tuple[str, str], float]  # (partition, node) -> cpu quota
    part_index: dict[str, FreeIndex]  # partition -> its pieces by free quota

    def _compute_partitions(self: Core) -> None:
        self._parts_dirty = False
        alive = [(n.name, n.cap) for n in self.nodes.values() if n.alive]
        nodes = cpu_nodes(alive)
        if self.policy.partitioned == "trajectory":
            t = self.config.trajectories or max(1, len(nodes))
            weights = {f"slot{i}": 1.0 for i in range(t)}
        else:
            shares = self.config.task_shares or {"*": 1.0}
            weights = {f"task:{k}": float(v) for k, v in shares.items()}
        self.partitions = split_cpu(nodes, weights)
        self.part_by_node = {}
        self.part_quota = {}
        self.part_index = {}
        for p, pieces in self.partitions.items():
            idx = self.part_index[p] = FreeIndex()
            for name, quota in pieces:
                self.part_by_node.setdefault(name, []).append(p)
                self.part_quota[(p, name)] = quota
                idx.update(name, {CPU: quota - self.part_used.get((p, name), 0.0)})
            self.touched.add(("part", p))

    def _partition_for(self: Core, spec: ActionSpec) -> str:
        if self.policy.partitioned == "trajectory":
            return self._slot_of(trajectory_of(spec))
        return self._pool_of(spec.task)

    def _session_partition(self: Core, sess: SessionRecord) -> str | None:
        """The slice or pool a session opened before any of its actions belongs to."""
        if self.policy.partitioned == "trajectory" and sess.trajectory is not None:
            return self._slot_of(sess.trajectory)
        if self.policy.partitioned == "task" and sess.task is not None:
            return self._pool_of(sess.task)
        return None

    def _slot_of(self: Core, traj: str) -> str:
        slot = self.traj_slot.get(traj)
        if slot is None:
            t = self.config.trajectories or max(1, len(cpu_nodes(
                [(n.name, n.cap) for n in self.nodes.values() if n.alive])))
            slot = self.traj_slot[traj] = f"slot{len(self.traj_slot) % t}"
        return slot

    def _pool_of(self: Core, task: str) -> str:
        shares = self.config.task_shares
        if not shares:
            return "task:*"
        if task in shares:
            return f"task:{task}"
        return f"task:{max((n, k) for k, n in shares.items())[1]}"  # unknown task: largest pool

    def _piece_candidates(self: Core, p: str, need: float, only: str | None) -> list[str]:
        """Nodes of partition ``p`` to try: best fit on its free quota (largest room first for
        whole slices); when ``need`` exceeds every piece, the largest idle pieces."""
        if only is not None:
            return [only] if (p, only) in self.part_quota else []
        idx = self.part_index.get(p)
        if idx is None:
            return []
        k = self.config.fit_candidates
        out: list[str] = []
        if self.policy.whole_slice:
            for bucket in idx.buckets_down():
                out.extend(bucket)
                if len(out) >= k:
                    break
            return out[:k]
        for name in idx.from_level(need):
            out.append(name)
            if len(out) >= k:
                break
        pieces = self.partitions.get(p, ())
        if not out and pieces and need > pieces[0][1]:
            out = [n for n, q in pieces[:64] if self.part_used.get((p, n), 0.0) <= 1e-9]
        return out

    def _place_in_partition(self: Core, rec: ActionRecord, only: str | None) -> bool:
        p = rec.partition
        assert p is not None
        if self.policy.one_at_a_time and self.part_running.get(p, 0) > 0:
            return False
        spec = rec.spec
        need = spec.demand.get(CPU, 0.0)
        target = need
        el = spec.elasticity
        if self.policy.whole_slice and el is not None and el.dim == CPU:
            target = el.max
        for name in self._piece_candidates(p, need, only):
            quota = self.part_quota[(p, name)]
            node = self.nodes.get(name)
            if node is None or not node.alive:
                continue
            room = quota - self.part_used.get((p, name), 0.0)
            cpu = min(target, room)
            if need > 0 and (cpu <= 1e-9 or cpu < min(need, quota) - 1e-9):
                continue
            alloc = spec.demand if abs(cpu - need) <= 1e-12 else spec.demand.with_amount(CPU, cpu)
            if not node.fits(alloc):
                continue
            traj = trajectory_of(spec)
            warm = spec.session is not None or self.traj_node.get(traj) == name
            if self.policy.partitioned != "trajectory":
                warm = warm or self.placer.take_warm(node, rec.wkey)
            self.placer.start(rec, node, alloc, warm)
            self.traj_node[traj] = name
            self._part_use(p, name, cpu)
            self.part_running[p] = self.part_running.get(p, 0) + 1
            self.part_members[spec.id] = (p, name, cpu)
            return True
        return False

    def _part_use(self: Core, p: str, name: str, cpu: float) -> None:
        used = self.part_used.get((p, name), 0.0) + cpu
        used = used if used > 1e-9 else 0.0
        self.part_used[(p, name)] = used
        idx = self.part_index.get(p)
        if idx is not None and (p, name) in self.part_quota:
            idx.update(name, {CPU: self.part_quota[(p, name)] - used})

    def _part_release(self: Core, rec: ActionRecord) -> None:
        got = self.part_members.pop(rec.spec.id, None)
        if got is None:
            return
        p, name, cpu = got
        self._part_use(p, name, -cpu)
        self.part_running[p] -= 1
        self.dirty.add(name)
        self.touched.add(("part", p))
        keys = self.queues.session_queues_of(p)
        if keys:  # session queues of this partition wait on it too
            self.touched.update(keys)
