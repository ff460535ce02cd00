"""The cluster bench's rows: each path's p50 on a Redis Cluster beside one Redis."""

from __future__ import annotations

from benchkit.clusterbench import KINDS, rows_of


def test_each_path_gets_a_row_with_both_medians_and_the_cluster_over_standalone_ratio() -> None:
    samples = {("cluster", k): [0.004, 0.006, 0.005] for k in KINDS}
    samples |= {("standalone", k): [0.002, 0.0025, 0.003] for k in KINDS}
    rows = rows_of(samples, 3)
    assert [r[0].split(" p50")[0] for r in rows] == [
        "once final round",
        "initialize",
        "first request via the other router",
    ]
    for row in rows:
        assert row[1] == "5.00 / 2.50 ms"
        assert row[2] == "x2.00"
        assert row[3].startswith("3 alternating pairs")
