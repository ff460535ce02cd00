"""A repeated warning is due once per window and key: the first, then one a window."""

from __future__ import annotations

from mcpfleet.logthrottle import LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_warning_is_due_then_none_until_the_window_has_passed() -> None:
    clock = Clock()
    throttle = LogThrottle[str](60.0, clock)
    assert throttle.due("k")
    clock.now += 59.9
    assert not throttle.due("k")
    clock.now += 0.1  # exactly one window after the first
    assert throttle.due("k")
    assert not throttle.due("k")


def test_the_first_warning_is_due_at_time_zero() -> None:
    assert LogThrottle[str](60.0, lambda: 0.0).due("k")


def test_each_key_has_its_own_window() -> None:
    clock = Clock()
    throttle = LogThrottle[str](60.0, clock)
    assert throttle.due("a")
    assert throttle.due("b")
    assert not throttle.due("a")
    assert sorted(throttle.recent()) == ["a", "b"]
    clock.now += 60.0
    assert list(throttle.recent()) == []


def test_past_max_keys_only_the_expired_ones_are_forgotten() -> None:
    clock = Clock()
    throttle = LogThrottle[int](60.0, clock, max_keys=2)
    for key in range(3):
        assert throttle.due(key)
    clock.now += 30.0
    assert throttle.due(3)  # four keys held: the three are all within their window
    clock.now += 30.0
    assert throttle.due(4)  # 0, 1, 2 expired: forgotten before 4 is remembered
    assert sorted(throttle.recent()) == [3, 4]
    assert not throttle.due(3)
