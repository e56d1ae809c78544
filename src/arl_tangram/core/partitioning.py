"""Partitions of the static baselines: trajectory slices and task pools (CPU only).

Invariant: the quotas of a node's pieces add up to its CPU; what a partition has in use on a
node (``part_used``) is the sum of the CPU allotments of the actions it placed there, and the
per-partition index (``part_index``) buckets its pieces by free quota. A piece smaller than an
action's demand runs it, alone, at the piece's quota (fractional CPU runs proportionally
slower); ``one_at_a_time`` partitions run one action at a time.
"""

from __future__ import annotations

from .actions import ActionSpec
from .nodeindex import FreeIndex
from .placement import Placer
from .policies import cpu_nodes, split_cpu, trajectory_of
from .queues import Queues
from .records import ActionRecord, SessionRecord, partition_key
from .resources import CPU
from .state import CoreState


class Partitions:
    """The trajectory-bound and task-isolated partitions: pieces, quotas, what each uses."""

    def __init__(self, st: CoreState, placer: Placer, queues: Queues) -> None:
        self.st = st
        self.placer = placer
        self.queues = queues
        policy = st.policy
        self.kind = policy.partitioned  # None | "trajectory" | "task"
        self.whole_slice = policy.whole_slice
        self.one_at_a_time = policy.one_at_a_time
        self.pieces: dict[str, list[tuple[str, float]]] = {}  # partition -> (node, cpu quota)
        self.by_node: dict[str, list[str]] = {}  # node -> partitions with a piece on it
        self.stale = True  # the pieces need computing (`compute`): a node came or went
        self.quota: dict[tuple[str, str], float] = {}  # (partition, node) -> cpu quota
        self.index: dict[str, FreeIndex] = {}  # partition -> its pieces by free quota
        self.used: dict[tuple[str, str], float] = {}  # (partition, node) -> cpu in use
        self.running: dict[str, int] = {}  # partition -> actions running in it
        self.members: dict[str, tuple[str, str, float]] = {}  # action -> (partition, node, cpu)
        self.trajectory_slot: dict[str, str] = {}  # trajectory -> its slice
        self.trajectory_node: dict[str, str] = {}  # trajectory -> node of its last action

    def nodes_changed(self) -> None:
        self.stale = True

    def compute(self) -> None:
        """Cut the alive nodes' CPU into the pieces of every partition (`policies.split_cpu`)."""
        self.stale = False
        alive = [(n.name, n.cap) for n in self.st.nodes.values() if n.alive]
        nodes = cpu_nodes(alive)
        if self.kind == "trajectory":
            t = self.st.config.trajectories or max(1, len(nodes))
            weights = {f"slot{i}": 1.0 for i in range(t)}
        else:
            shares = self.st.config.task_shares or {"*": 1.0}
            weights = {f"task:{k}": float(v) for k, v in shares.items()}
        self.pieces = split_cpu(nodes, weights)
        self.by_node = {}
        self.quota = {}
        self.index = {}
        for p, pieces in self.pieces.items():
            idx = self.index[p] = FreeIndex()
            for name, quota in pieces:
                self.by_node.setdefault(name, []).append(p)
                self.quota[(p, name)] = quota
                idx.update(name, {CPU: quota - self.used.get((p, name), 0.0)})
            self.st.touched.add(partition_key(p))

    def partition_for(self, spec: ActionSpec) -> str:
        if self.kind == "trajectory":
            return self.slot_of(trajectory_of(spec))
        return self.pool_of(spec.task)

    def session_partition(self, sess: SessionRecord) -> str | None:
        """The slice or pool a session opened before any of its actions belongs to."""
        if self.kind == "trajectory" and sess.trajectory is not None:
            return self.slot_of(sess.trajectory)
        if self.kind == "task" and sess.task is not None:
            return self.pool_of(sess.task)
        return None

    def slot_of(self, traj: str) -> str:
        slot = self.trajectory_slot.get(traj)
        if slot is None:
            t = self.st.config.trajectories or max(1, len(cpu_nodes(
                [(n.name, n.cap) for n in self.st.nodes.values() if n.alive])))
            slot = self.trajectory_slot[traj] = f"slot{len(self.trajectory_slot) % t}"
        return slot

    def pool_of(self, task: str) -> str:
        shares = self.st.config.task_shares
        if not shares:
            return "task:*"
        if task in shares:
            return f"task:{task}"
        return f"task:{max((n, k) for k, n in shares.items())[1]}"  # unknown task: largest pool

    def piece_candidates(self, p: str, need: float, only: str | None) -> list[str]:
        """Nodes of partition ``p`` to try: best fit on its free quota (largest room first for
        whole slices); when ``need`` exceeds every piece, the largest idle pieces."""
        if only is not None:
            return [only] if (p, only) in self.quota else []
        idx = self.index.get(p)
        if idx is None:
            return []
        k = self.st.config.fit_candidates
        out: list[str] = []
        if self.whole_slice:
            for bucket in idx.buckets_down():
                out.extend(bucket)
                if len(out) >= k:
                    break
            return out[:k]
        for name in idx.from_level(need):
            out.append(name)
            if len(out) >= k:
                break
        pieces = self.pieces.get(p, ())
        if not out and pieces and need > pieces[0][1]:
            out = [n for n, q in pieces[:64] if self.used.get((p, n), 0.0) <= 1e-9]
        return out

    def place(self, rec: ActionRecord, only: str | None) -> bool:
        p = rec.partition
        assert p is not None
        if self.one_at_a_time and self.running.get(p, 0) > 0:
            return False
        spec = rec.spec
        need = spec.demand.get(CPU, 0.0)
        target = need
        el = spec.elasticity
        if self.whole_slice and el is not None and el.dim == CPU:
            target = el.max
        for name in self.piece_candidates(p, need, only):
            quota = self.quota[(p, name)]
            node = self.st.nodes.get(name)
            if node is None or not node.alive:
                continue
            room = quota - self.used.get((p, name), 0.0)
            cpu = min(target, room)
            if need > 0 and (cpu <= 1e-9 or cpu < min(need, quota) - 1e-9):
                continue
            alloc = spec.demand if abs(cpu - need) <= 1e-12 else spec.demand.with_amount(CPU, cpu)
            if not node.fits(alloc):
                continue
            traj = trajectory_of(spec)
            warm = spec.session is not None or self.trajectory_node.get(traj) == name
            if self.kind != "trajectory":
                warm = warm or self.placer.take_warm(node, rec.wkey)
            self.placer.start(rec, node, alloc, warm)
            self.trajectory_node[traj] = name
            self.use(p, name, cpu)
            self.running[p] = self.running.get(p, 0) + 1
            self.members[spec.id] = (p, name, cpu)
            return True
        return False

    def use(self, p: str, name: str, cpu: float) -> None:
        used = self.used.get((p, name), 0.0) + cpu
        used = used if used > 1e-9 else 0.0
        self.used[(p, name)] = used
        idx = self.index.get(p)
        if idx is not None and (p, name) in self.quota:
            idx.update(name, {CPU: self.quota[(p, name)] - used})

    def release(self, rec: ActionRecord) -> tuple[str, str] | None:
        """Give an ended action's quota back: what changed, for the core to mark (the
        partition and the node whose quota grew), or None when it held none."""
        got = self.members.pop(rec.spec.id, None)
        if got is None:
            return None
        p, name, cpu = got
        self.use(p, name, -cpu)
        self.running[p] -= 1
        return p, name
