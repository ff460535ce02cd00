"""The listen fan-out bench's arithmetic (benchkit.listenbench), without a fleet."""

from __future__ import annotations

import pytest

from benchkit.listenbench import fanout_rows, quantile

pytestmark = pytest.mark.rigs


def test_quantile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_the_rows_give_latencies_in_ms_and_cpu_per_event_per_stream() -> None:
    latencies = [0.001 * (i % 10 + 1) for i in range(1000)]
    rows = fanout_rows(latencies, [0.010, 0.020], cpu=2_000_000_000, events=2, streams=1000)
    assert rows[0][1] == "p50 5.0 ms / p99 10.0 ms"
    assert rows[1][1] == "p50 10.0 ms / max 20.0 ms"
    # 2 s of CPU over 2 events x 1000 streams: 1 ms per delivery.
    assert rows[2][1] == "1000.0 us"
    assert rows[2][3].startswith("1000.0 ms per event")
