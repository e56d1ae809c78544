from arl_tangram.sim.loop import ARRIVAL, REPORT, TICK, EventLoop


def test_callbacks_run_in_time_priority_then_scheduling_order():
    loop = EventLoop()
    seen: list[str] = []
    loop.at(2.0, seen.append, "late")
    loop.at(1.0, seen.append, "tick", priority=TICK)
    loop.at(1.0, seen.append, "arrival-a", priority=ARRIVAL)
    loop.at(1.0, seen.append, "report", priority=REPORT)
    loop.at(1.0, seen.append, "arrival-b", priority=ARRIVAL)
    loop.run()
    assert seen == ["report", "arrival-a", "arrival-b", "tick", "late"]
    assert loop.now == 2.0
    assert loop.processed == 5


def test_run_until_stops_the_clock_there_and_keeps_the_rest():
    loop = EventLoop()
    seen: list[float] = []
    for t in (1.0, 5.0, 9.0):
        loop.at(t, lambda t=t: seen.append(loop.now))
    loop.run(until=6.0)
    assert seen == [1.0, 5.0]
    assert loop.now == 6.0
    assert loop.peek() == 9.0
    loop.run()
    assert seen == [1.0, 5.0, 9.0]


def test_callbacks_scheduled_from_callbacks_and_past_times_clamp_to_now():
    loop = EventLoop()
    seen: list[float] = []

    def chain(n: int) -> None:
        seen.append(loop.now)
        if n:
            loop.after(0.5, chain, n - 1)
            loop.at(-10.0, seen.append, -1.0)  # in the past: runs now, never moves time back

    loop.at(1.0, chain, 2)
    loop.run()
    assert seen == [1.0, -1.0, 1.5, -1.0, 2.0]


def test_stop_predicate_ends_the_run():
    loop = EventLoop()
    count = []
    for t in range(10):
        loop.at(float(t), count.append, t)
    loop.run(stop=lambda: len(count) >= 3)
    assert count == [0, 1, 2]
    assert len(loop) == 7
    assert loop.processed == 3


def test_plain_run_and_run_with_until_or_stop_take_the_same_order():
    # `run()` has its own loop (no ``until``/``stop`` checks): it must run what the general loop
    # runs, in the same order, callbacks scheduling callbacks (same instant, other priorities).
    import random

    def play(**kw: object) -> tuple[list[tuple[float, int]], int]:
        rng = random.Random(7)
        loop = EventLoop()
        seen: list[tuple[float, int]] = []

        def cb(n: int) -> None:
            seen.append((loop.now, n))
            if n < 400:
                for k in range(2):
                    loop.at(loop.now + rng.choice((0.0, 0.5, rng.random())), cb, 2 * n + k + 1,
                            priority=rng.choice((REPORT, ARRIVAL, TICK)))

        loop.at(0.0, cb, 0)
        loop.run(**kw)  # type: ignore[arg-type]
        return seen, loop.processed

    plain = play()
    assert len(plain[0]) > 400
    assert play(until=1e9) == plain
    assert play(stop=lambda: False) == plain
