"""``mcpfleet dev``'s restart decisions: back-off that doubles, resets once stable."""

from __future__ import annotations

from mcpfleet.dev.supervisor import BACKOFF_FIRST, BACKOFF_MAX, STABLE_AFTER, Restarts, due


def test_an_exit_waits_its_back_off_then_restarts_and_the_next_back_off_doubles() -> None:
    record = Restarts(started=0.0)
    go, record = due(record, alive=False, now=1.0)
    assert not go and record.exited_at == 1.0
    go, record = due(record, alive=False, now=1.0 + BACKOFF_FIRST / 2)
    assert not go
    go, record = due(record, alive=False, now=1.0 + BACKOFF_FIRST)
    assert go and record.backoff == 2 * BACKOFF_FIRST and record.started == 1.0 + BACKOFF_FIRST


def test_a_process_that_keeps_dying_backs_off_to_the_maximum() -> None:
    record, now, waits = Restarts(started=0.0), 0.0, []
    for _ in range(12):
        exited = now
        while True:
            go, record = due(record, alive=False, now=now)
            if go:
                break
            now += 0.05
        waits.append(round(now - exited, 2))
        now += 0.05
    assert waits[0] < waits[1] < waits[2]
    assert max(waits) <= BACKOFF_MAX + 0.1 and waits[-1] >= BACKOFF_MAX - 0.1


def test_staying_up_resets_the_back_off() -> None:
    record = Restarts(started=100.0, backoff=8.0)
    go, record = due(record, alive=True, now=100.0 + STABLE_AFTER / 2)
    assert not go and record.backoff == 8.0
    go, record = due(record, alive=True, now=100.0 + STABLE_AFTER)
    assert not go and record.backoff == BACKOFF_FIRST
