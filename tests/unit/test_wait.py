"""The one wait helper of the local fleet and the test rigs."""

from __future__ import annotations

import itertools

import pytest

from mcpfleet.dev.wait import WaitTimeout, wait_for


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", {"ready": True}])
    assert wait_for(lambda: next(values), timeout=5, interval=0) == {"ready": True}


def test_a_timeout_names_what_was_awaited_and_is_a_timeout_error() -> None:
    with pytest.raises(WaitTimeout, match=r"timed out after 0\.1s waiting for the answer") as info:
        wait_for(lambda: False, timeout=0.1, what="the answer", interval=0.01)
    assert isinstance(info.value, TimeoutError)


def test_an_exception_not_listed_propagates_at_once() -> None:
    calls = itertools.count()

    def exited() -> bool:
        next(calls)
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_for(exited, timeout=30, interval=0)
    assert next(calls) == 1  # no second poll: the wait ended with the first error


def test_listed_exceptions_mean_not_yet_and_the_last_is_chained() -> None:
    attempts = iter([ConnectionRefusedError("not listening"), None, True])

    def check() -> bool | None:
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert wait_for(check, timeout=5, interval=0, retry_on=(OSError,)) is True

    def never() -> bool:
        raise ConnectionRefusedError("still not listening")

    with pytest.raises(WaitTimeout, match="still not listening") as info:
        wait_for(never, timeout=0.05, interval=0.01, retry_on=(OSError,))
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
