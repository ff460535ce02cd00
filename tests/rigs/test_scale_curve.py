"""The cost curve's arithmetic and rows (``make bench-scale``): ratios to the first step,
flat / grows verdicts, commands per unit net of the background, one master's ceiling."""

from __future__ import annotations

import pytest

from benchkit.scalecurve import (
    Curve,
    PathCost,
    Step,
    breakdown,
    curve_rows,
    first_limit,
    path_rows,
    per_unit,
    ratio,
    verdict,
)
from benchkit.scalepaths import parse_benchmark


def test_a_cost_within_the_tolerance_of_the_first_step_is_flat() -> None:
    first = Step(1_000, 200.0)
    assert verdict(first, Step(100_000, 220.0)) == "flat (x1.10 for x100 units)"
    assert verdict(first, Step(100_000, 160.0)) == "flat (x0.80 for x100 units)"


def test_just_past_the_tolerance_is_growth_and_says_how_fast() -> None:
    first = Step(3, 100.0)
    assert verdict(first, Step(300, 131.0)).startswith("grows x1.31 for x100 units: slower")
    # Per-unit cost rising as fast as the units: the total grows with their square.
    assert verdict(first, Step(300, 8_000.0)) == (
        "grows x80.00 for x100 units: about linearly in the units"
    )
    assert "k=0.50" in verdict(first, Step(300, 1_000.0))


def test_a_falling_cost_is_not_called_flat() -> None:
    assert verdict(Step(1, 10.0), Step(4, 5.0)) == "falls x0.50 for x4 units"


def test_the_first_step_and_costs_from_nothing() -> None:
    first = Step(1_000, 0.0)
    assert verdict(first, first) == "first step"
    assert verdict(first, Step(10_000, 0.0)).startswith("flat")
    assert verdict(first, Step(10_000, 2.0)) == "grows from 0 to 2 (x10 units)"
    assert ratio(0.0, 2.0) is None
    assert ratio(4.0, 2.0) == 0.5


def test_each_step_is_a_row_with_its_ratio_to_the_first() -> None:
    curve = Curve("replicas in the registry", "router CPU per registry read", "us")
    curve.add(3, 1000.0)
    curve.add(30, 1100.0, "idle 10 s")
    curve.add(300, 4000.0)
    rows = curve_rows(curve)
    assert [r[0] for r in rows] == [
        "scale, replicas in the registry 3: router CPU per registry read",
        "scale, replicas in the registry 30: router CPU per registry read",
        "scale, replicas in the registry 300: router CPU per registry read",
    ]
    assert [r[1] for r in rows] == ["1000.0 us", "1100.0 us", "4000.0 us"]
    assert [r[2] for r in rows] == ["x1.00", "x1.10", "x4.00"]
    assert rows[1][3] == "flat (x1.10 for x10 units); idle 10 s"
    assert rows[2][3].startswith("grows x4.00 for x100 units")
    assert curve_rows(Curve("routers", "x", "us")) == []


def test_a_curve_from_zero_prints_no_ratio() -> None:
    curve = Curve("sessions", "lookups", "", digits=2)
    curve.add(1, 0.0)
    curve.add(10, 1.0)
    assert [r[1:3] for r in curve_rows(curve)] == [("0.00 ", "x1.00"), ("1.00 ", "x-")]


def test_commands_per_unit_are_net_of_the_background_over_the_window() -> None:
    before = {"mget": 100, "set": 10, "smembers": 50}
    after = {"mget": 300, "set": 16, "smembers": 58, "publish": 1}
    # Background: 4 SMEMBERS/s and 2 SET/s over a 2 s window.
    out = per_unit(before, after, {"smembers": 4.0, "set": 2.0}, 2.0, 200)
    # MGET: 200 calls, 1 per unit. SET nets 6 - 4 = 2 and SMEMBERS 8 - 8 = 0; SET's
    # 2 and PUBLISH's 1 are under 0.02 per unit (4 calls over 200): noise, left out.
    assert out == {"mget": 1.0}
    few = per_unit({"eval": 0}, {"eval": 5}, {}, 1.0, 5)
    assert few == {"eval": 1.0}


def test_a_breakdown_lists_the_largest_first_as_rates_or_net_counts() -> None:
    commands = {"set": 3.0, "eval": 1.0, "get": 1.0}
    assert breakdown(commands) == "SET 3.00, EVAL 1.00, GET 1.00"
    assert breakdown(commands, 50) == "SET +150, EVAL +50, GET +50"
    assert breakdown({}) == "none"


def test_one_masters_ceiling_is_its_commands_per_second_over_a_paths_commands() -> None:
    paths = [
        PathCost("once-flow, answer round", {"set": 3.0, "eval": 1.0, "get": 1.0, "pttl": 1.0}, 50),
        PathCost("modern round (stateless)", {}, 1000),
    ]
    rows = first_limit(120_000.0, paths)
    assert rows[0][:2] == (
        "scale, one Redis master's ceiling, once-flow, answer round",
        "20,000 rounds/s",
    )
    assert rows[0][3] == "120,000 commands/s / 6.00 commands per unit"
    assert rows[1][1] == "not bounded by Redis"
    held = PathCost(
        "held session (per session per second)", {"eval": 0.1}, 200, ceiling_unit="sessions held"
    )
    assert first_limit(120_000.0, [held])[0][1] == "1,200,000 sessions held"
    table = path_rows(paths)
    assert table[0][1:4] == ("6.00", "SET +150, EVAL +50, GET +50, PTTL +50", "n=50")


REDIS_BENCHMARK_Q = (
    "\rSET: rps=0.0 (overall: 83000.0) avg_msec=0.020 (overall: 0.020)\r"
    + " " * 60
    + "\rSET: 166666.67 requests per second, p50=0.015 msec\n"
    "\rGET: 124999.99 requests per second, p50=0.015 msec\n\n"
)


def test_redis_benchmarks_quiet_output_is_read_past_its_progress_lines() -> None:
    assert parse_benchmark(REDIS_BENCHMARK_Q) == {"SET": 166666.67, "GET": 124999.99}
    assert parse_benchmark("Could not connect to Redis at 127.0.0.1:1\n") == {}


@pytest.mark.parametrize("tolerance", [0.1, 0.3])
def test_the_tolerance_is_the_line_between_flat_and_grows(tolerance: float) -> None:
    first = Step(1, 100.0)
    assert verdict(first, Step(10, 100.0 * (1 + tolerance) - 0.01), tolerance).startswith("flat")
    assert verdict(first, Step(10, 100.0 * (1 + tolerance) + 0.01), tolerance).startswith("grows")
