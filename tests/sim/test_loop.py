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
