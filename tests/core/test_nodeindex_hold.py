"""`FreeIndex.hold` puts off a node's bucket move without changing what any reader sees.

Random runs of updates, holds and reads on two indexes, one holding and one updating at once:
after every read (and at every flush) the buckets -- their order included, which breaks ties
in placement -- and the levels are identical.
"""

from __future__ import annotations

import random

from arl_tangram.core.nodeindex import FreeIndex


def _state(idx: FreeIndex) -> tuple[list[int], dict[int, list[str]], dict[str, int]]:
    return list(idx.levels), {lv: list(b) for lv, b in idx._buckets.items()}, dict(idx._level)


def test_held_moves_read_as_immediate_ones() -> None:
    rng = random.Random(11)
    for _ in range(200):
        eager, lazy = FreeIndex(), FreeIndex()
        names = [f"n{i}" for i in range(rng.randint(1, 6))]
        for n in names:
            free = {"cpu": float(rng.randint(0, 8))}
            eager.update(n, free)
            lazy.update(n, free)
        for _ in range(60):
            n = rng.choice(names)
            free = {"cpu": rng.choice([0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 8.0])}
            op = rng.random()
            if op < 0.35:
                eager.update(n, free)
                lazy.hold(n, free)
            elif op < 0.8:
                eager.update(n, free)
                lazy.update(n, free)
            elif op < 0.9:
                assert list(eager.from_level(free["cpu"])) == list(lazy.from_level(free["cpu"]))
                assert _state(eager) == _state(lazy)
            else:
                lazy.flush()
                assert _state(eager) == _state(lazy)
        lazy.flush()
        assert _state(eager) == _state(lazy)
        assert eager.max_level() == lazy.max_level()
