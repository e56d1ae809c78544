"""core/nodeindex.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
levels of free CPU (four per core, the 1e-9 tolerance, nothing free as 0), which node names a
bucket scan yields and in what order (fullest first, emptiest first, the edges at a demand's
own level and past the largest), a held node's bucket kept until a flush or a read and then put
at the end of its final bucket (or left where it was when no move it held changed its level),
the nodes a `SpreadIndex` marks, ranks and pops (stale entries dropped, a node popped once), and
its heap compacted past twice the ranked nodes plus 64 entries."""

from __future__ import annotations

from arl_tangram.core.nodeindex import RES, FreeIndex, SpreadIndex, level


def _cpu(c: float) -> dict[str, float]:
    return {"cpu": c}


def _state(idx: FreeIndex) -> tuple[list[int], dict[int, list[str]], dict[str, int]]:
    return list(idx.levels), {lv: list(b) for lv, b in idx._buckets.items()}, dict(idx._level)


def _index(*nodes: tuple[str, float]) -> FreeIndex:
    idx = FreeIndex()
    for name, c in nodes:
        idx.update(name, _cpu(c))
    return idx


def _down(idx: FreeIndex, cpu: float | None = None) -> list[list[str]]:
    return [list(b) for b in (idx.buckets_down() if cpu is None else idx.buckets_down(cpu))]


def _up(idx: FreeIndex, cpu: float) -> list[list[str]]:
    return [list(b) for b in idx.buckets_from(cpu)]


def test_levels_are_quarters_of_a_core_with_a_tolerance_of_1e_9() -> None:
    assert RES == 4
    assert [level(c) for c in (0.0, 0.1, 0.24, 0.25, 0.5, 0.74, 0.75, 1.0, 2.0, 7.9)] == \
        [0, 0, 0, 1, 2, 2, 3, 4, 8, 31]
    assert level(0.75 - 1e-12) == 3  # within the tolerance
    assert level(0.75 - 1e-8) == 2  # past it
    assert level(-1.0) == 0 and level(-0.1) == 0  # nothing free (an overcommitted node)
    assert level(1e-12) == 0


def test_a_new_index_is_empty() -> None:
    idx = FreeIndex()
    assert idx.spread is None and idx._held is None and idx._held_level == 0
    assert idx._held_moved is False
    assert len(idx) == 0 and idx.names() == [] and "n" not in idx
    assert idx.levels == [] and idx.max_level() == -1
    assert idx.buckets_from(0.0) == [] and idx.buckets_down() == [] and list(idx.from_level(0)) == []


def test_a_node_may_be_named_by_the_empty_string() -> None:
    idx = FreeIndex()
    idx.update("", _cpu(1.0))  # (nothing is held: the name is not taken for a held one)
    assert "" in idx and _state(idx) == ([4], {4: [""]}, {"": 4})


def test_buckets_by_level_in_insertion_order() -> None:
    idx = _index(("a", 2.0), ("b", 0.5), ("c", 2.1), ("d", 0.0), ("e", 4.0), ("f", 0.5))
    assert len(idx) == 6 and idx.names() == ["a", "b", "c", "d", "e", "f"]
    assert "a" in idx and "z" not in idx
    assert _state(idx) == ([0, 2, 8, 16], {8: ["a", "c"], 2: ["b", "f"], 0: ["d"], 16: ["e"]},
                           {"a": 8, "b": 2, "c": 8, "d": 0, "e": 16, "f": 2})
    assert idx.max_level() == 16
    # a demand's own level is included; fullest (least free) first
    assert _up(idx, 0.0) == [["d"], ["b", "f"], ["a", "c"], ["e"]]
    assert _up(idx, 0.5) == [["b", "f"], ["a", "c"], ["e"]]
    assert _up(idx, 0.6) == [["b", "f"], ["a", "c"], ["e"]]  # 0.5 may cover 0.6 (one level)
    assert _up(idx, 0.75) == [["a", "c"], ["e"]]
    assert _up(idx, 2.0) == [["a", "c"], ["e"]]
    assert _up(idx, 4.0) == [["e"]]  # the largest level exactly
    assert _up(idx, 4.25) == []
    assert list(idx.from_level(0.0)) == ["d", "b", "f", "a", "c", "e"]
    assert list(idx.from_level(0.5)) == ["b", "f", "a", "c", "e"]
    assert list(idx.from_level(2.0)) == ["a", "c", "e"]
    assert list(idx.from_level(4.0)) == ["e"]
    assert list(idx.from_level(4.25)) == []
    # emptiest (most free) first, down to the demand's level (included); all of them by default
    assert _down(idx) == [["e"], ["a", "c"], ["b", "f"], ["d"]]
    assert _down(idx, 0.5) == [["e"], ["a", "c"], ["b", "f"]]
    assert _down(idx, 0.0) == _down(idx)
    assert _down(idx, 0.25) == [["e"], ["a", "c"], ["b", "f"]]
    assert _down(idx, 2.0) == [["e"], ["a", "c"]]
    assert _down(idx, 4.0) == [["e"]]
    assert _down(idx, 4.25) == []


def test_a_missing_cpu_counts_as_none_free() -> None:
    idx = _index(("a", 3.0))
    idx.update("b", {"memory_mb": 4096.0})
    assert _state(idx) == ([0, 12], {12: ["a"], 0: ["b"]}, {"a": 12, "b": 0})
    idx.hold("a", {"memory_mb": 1.0})
    assert idx._held == "a" and idx._held_level == 0 and idx._held_moved is True
    idx.flush()
    assert _state(idx) == ([0], {0: ["b", "a"]}, {"a": 0, "b": 0})


def test_moves_drop_empty_buckets_and_keep_the_levels_sorted() -> None:
    idx = _index(("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0))
    assert idx.levels == [4, 8, 12, 16]
    idx.update("b", _cpu(4.0))  # level 8 empties: the one in the middle goes
    assert _state(idx) == ([4, 12, 16], {4: ["a"], 12: ["c"], 16: ["d", "b"]},
                           {"a": 4, "b": 16, "c": 12, "d": 16})
    idx.update("a", _cpu(1.1))  # the same level: not moved
    idx.update("d", _cpu(4.2))  # the same level: stays first
    assert _state(idx)[1] == {4: ["a"], 12: ["c"], 16: ["d", "b"]}
    idx.update("c", _cpu(0.5))
    assert idx.levels == [2, 4, 16]
    idx.update("a", _cpu(0.5))
    assert _state(idx) == ([2, 16], {2: ["c", "a"], 16: ["d", "b"]}, {"a": 2, "b": 16, "c": 2, "d": 16})
    idx.remove("d")
    idx.remove("zz")  # not indexed: nothing
    assert _state(idx) == ([2, 16], {2: ["c", "a"], 16: ["b"]}, {"a": 2, "b": 16, "c": 2})
    idx.remove("b")
    assert _state(idx) == ([2], {2: ["c", "a"]}, {"a": 2, "c": 2})
    assert idx.max_level() == 2 and len(idx) == 2 and "b" not in idx
    idx.remove("c")
    idx.remove("a")
    assert _state(idx) == ([], {}, {}) and idx.max_level() == -1


def test_a_held_node_stays_in_its_bucket_until_a_flush_then_goes_to_the_end_of_its_last() -> None:
    idx = _index(("a", 1.0), ("b", 1.0), ("c", 2.0))
    idx.hold("a", _cpu(2.0))
    assert idx._held == "a" and idx._held_level == 8 and idx._held_moved is True
    assert _state(idx) == ([4, 8], {4: ["a", "b"], 8: ["c"]}, {"a": 4, "b": 4, "c": 8})
    idx.update("a", _cpu(1.0))  # held on: back to where it is, only noted
    assert idx._held == "a" and idx._held_level == 4 and idx._held_moved is True
    assert _state(idx)[1] == {4: ["a", "b"], 8: ["c"]}
    idx.update("a", _cpu(3.0))
    assert idx._held == "a" and idx._held_level == 12 and idx._held_moved is True
    assert _state(idx)[1] == {4: ["a", "b"], 8: ["c"]}
    idx.hold("a", _cpu(1.0))  # back at the level it is in: still moved (to the end)
    assert idx._held == "a" and idx._held_level == 4 and idx._held_moved is True
    idx.flush()
    assert idx._held is None
    assert _state(idx) == ([4, 8], {4: ["b", "a"], 8: ["c"]}, {"a": 4, "b": 4, "c": 8})
    idx.flush()  # nothing held: nothing
    assert _state(idx) == ([4, 8], {4: ["b", "a"], 8: ["c"]}, {"a": 4, "b": 4, "c": 8})


def test_a_hold_at_the_same_level_moves_nothing() -> None:
    idx = _index(("a", 1.0), ("b", 1.0))
    idx.hold("a", _cpu(1.2))
    assert idx._held == "a" and idx._held_level == 4 and idx._held_moved is False
    idx.update("a", _cpu(1.1))  # held on, the same level: not moved
    assert idx._held == "a" and idx._held_level == 4 and idx._held_moved is False
    idx.flush()
    assert idx._held is None and idx._held_moved is False
    assert _state(idx) == ([4], {4: ["a", "b"]}, {"a": 4, "b": 4})


def test_a_hold_of_a_node_not_indexed_is_an_update() -> None:
    idx = _index(("a", 1.0))
    idx.hold("n", _cpu(2.0))
    assert idx._held is None
    assert _state(idx) == ([4, 8], {4: ["a"], 8: ["n"]}, {"a": 4, "n": 8})


def test_an_update_of_another_node_flushes_the_held_one_first() -> None:
    idx = _index(("a", 1.0), ("b", 1.0), ("c", 0.0))
    idx.hold("a", _cpu(0.0))
    idx.update("b", _cpu(0.0))
    assert idx._held is None
    assert _state(idx) == ([0], {0: ["c", "a", "b"]}, {"a": 0, "b": 0, "c": 0})
    idx.hold("a", _cpu(1.0))
    idx.hold("b", _cpu(1.0))  # another hold flushes too
    assert idx._held == "b"
    assert _state(idx) == ([0, 4], {0: ["c", "b"], 4: ["a"]}, {"a": 4, "b": 0, "c": 0})
    idx.update("b", _cpu(0.0))  # held on: back at its level, to the end of it at the flush
    idx.update("c", _cpu(0.1))  # c's own level: c stays, the held one is flushed all the same
    assert idx._held is None
    assert _state(idx) == ([0, 4], {0: ["c", "b"], 4: ["a"]}, {"a": 4, "b": 0, "c": 0})


def test_every_read_flushes_a_held_node() -> None:
    def held() -> FreeIndex:
        idx = _index(("a", 1.0), ("b", 1.0))
        idx.hold("a", _cpu(2.0))
        return idx

    idx = held()
    assert _up(idx, 0.0) == [["b"], ["a"]] and idx._held is None
    idx = held()
    assert _down(idx) == [["a"], ["b"]] and idx._held is None
    idx = held()
    assert list(idx.from_level(0.0)) == ["b", "a"] and idx._held is None
    idx = held()
    assert idx.max_level() == 8 and idx._held is None
    idx = held()
    idx.remove("b")
    assert idx._held is None and _state(idx) == ([8], {8: ["a"]}, {"a": 8})
    idx = held()
    idx.remove("a")  # the held node itself
    assert idx._held is None and _state(idx) == ([4], {4: ["b"]}, {"b": 4})


def test_every_change_marks_the_node_in_the_attached_spread_index() -> None:
    idx = _index(("a", 1.0))
    sp = idx.spread = SpreadIndex(lambda n: None)
    idx.update("a", _cpu(1.0))  # even when its level stays
    idx.update("b", _cpu(2.0))
    assert list(sp.dirty) == ["a", "b"]
    sp.dirty.clear()
    idx.hold("b", _cpu(1.0))
    idx.hold("b", _cpu(0.0))
    idx.update("b", _cpu(3.0))
    assert list(sp.dirty) == ["b"]
    idx.hold("a", _cpu(0.0))
    assert list(sp.dirty) == ["b", "a"]
    sp.dirty.clear()
    idx.remove("zz")
    idx.remove("a")
    assert list(sp.dirty) == ["zz", "a"]
    sp.dirty.clear()
    sp.touch("q")
    assert list(sp.dirty) == ["q"]


def _spread(ranks: dict[str, tuple[float, float] | None]) -> SpreadIndex:
    return SpreadIndex(lambda n: ranks.get(n))


def _pop_all(sp: SpreadIndex) -> list[str]:
    out = []
    while (n := sp.pop()) is not None:
        out.append(n)
    return out


def test_spread_pops_by_rank_then_name_and_drops_stale_entries() -> None:
    ranks: dict[str, tuple[float, float] | None] = {
        "a": (1.0, -4.0), "b": (0.0, -2.0), "c": (0.0, -8.0), "d": (1.0, -4.0), "x": None}
    sp = _spread(ranks)
    assert len(sp) == 0 and sp.pop() is None
    for n in ("a", "b", "c", "d", "x"):
        sp.touch(n)
    sp.refresh()
    assert sp.dirty == {} and len(sp) == 4
    assert sp.rank == {"a": (1.0, -4.0), "b": (0.0, -2.0), "c": (0.0, -8.0), "d": (1.0, -4.0)}
    assert sorted(sp.heap) == [(0.0, -8.0, "c"), (0.0, -2.0, "b"), (1.0, -4.0, "a"), (1.0, -4.0, "d")]
    assert _pop_all(sp) == ["c", "b", "a", "d"]
    sp.push_back(["c", "b", "a", "d"])
    assert sorted(sp.heap) == [(0.0, -8.0, "c"), (0.0, -2.0, "b"), (1.0, -4.0, "a"), (1.0, -4.0, "d")]
    # a's second key changes, b's first, c goes: their old entries are stale
    ranks.update(a=(1.0, -1.0), b=(2.0, -2.0), c=None)
    sp.touch("a")
    sp.touch("b")
    sp.touch("c")
    sp.touch("d")  # unchanged: no second entry
    sp.refresh()
    assert sp.rank == {"a": (1.0, -1.0), "b": (2.0, -2.0), "d": (1.0, -4.0)}
    assert len(sp.heap) == 6 and len(sp) == 3
    assert _pop_all(sp) == ["d", "a", "b"]  # each once
    assert sp.heap == []
    sp.push_back(["b"])
    assert sp.heap == [(2.0, -2.0, "b")]


def test_spread_refresh_with_nothing_marked_keeps_everything() -> None:
    ranks: dict[str, tuple[float, float] | None] = {"a": (0.0, 0.0)}
    sp = _spread(ranks)
    sp.touch("a")
    sp.refresh()
    ranks["a"] = (5.0, 5.0)
    sp.refresh()  # not marked: not looked at
    assert sp.rank == {"a": (0.0, 0.0)} and sp.heap == [(0.0, 0.0, "a")]


def test_spread_heap_is_compacted_past_twice_the_ranked_nodes_plus_64() -> None:
    ranks: dict[str, tuple[float, float] | None] = {"a": (0.0, 0.0), "b": (9.0, 0.0)}
    sp = _spread(ranks)
    sp.touch("a")
    sp.touch("b")
    sp.refresh()
    assert len(sp.heap) == 2
    for i in range(1, 67):  # 2 + 66 = 68 = 2 x 2 + 64 entries: kept
        ranks["a"] = (float(i), 0.0)
        sp.touch("a")
        sp.refresh()
    assert len(sp.heap) == 68
    ranks["a"] = (100.0, 0.0)
    sp.touch("a")
    sp.refresh()  # 69: compacted to one entry per ranked node
    assert sorted(sp.heap) == [(9.0, 0.0, "b"), (100.0, 0.0, "a")]
    assert _pop_all(sp) == ["b", "a"]
