"""The bench load generator's pure helpers: wrk's result line, percentiles, /proc CPU times."""

from __future__ import annotations

import json
import math

import pytest

from benchkit.loadgen import (
    WrkResult,
    machine_ticks,
    merge,
    parse_result,
    percentile,
    stat_cpu_ticks,
)


def test_stat_cpu_ticks_adds_utime_and_stime_even_with_spaces_and_parens_in_the_name() -> None:
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "10", "0", "0", "0", "1234", "56"]
    line = "4242 (wrk (x) y) " + " ".join(fields) + " 0 0 20 0 1 0 100 2000 300"
    assert stat_cpu_ticks(line) == 1234 + 56


def test_machine_ticks_counts_idle_and_iowait_as_not_busy() -> None:
    busy, total = machine_ticks("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 1 2 3 4\n")
    assert total == 100 + 5 + 50 + 800 + 40 + 3 + 2
    assert busy == total - 800 - 40


def test_percentile_of_a_histogram_is_the_smallest_value_covering_the_quantile() -> None:
    hist = {100: 50, 200: 40, 5000: 10}
    assert percentile(hist, 0.5) == 100
    assert percentile(hist, 0.51) == 200
    assert percentile(hist, 0.9) == 200
    assert percentile(hist, 0.99) == 5000
    assert math.isnan(percentile({}, 0.5))


def test_merging_results_adds_counts_histograms_and_cpu() -> None:
    a = WrkResult(10, 1.0, 1, 0, {100: 10}, 0.1, 1.0, {"router": 0.5}, 1.5)
    b = WrkResult(30, 1.0, 0, 2, {100: 5, 300: 25}, 0.3, 1.0, {"router": 0.5, "nginx": 0.2}, 2.0)
    c = a + b
    assert (c.requests, c.bad, c.socket_errors) == (40, 1, 2)
    assert c.histogram == merge([a.histogram, b.histogram]) == {100: 15, 300: 25}
    assert c.rps == 20
    assert c.p(0.5) == 0.3  # ms
    assert c.wrk_share == pytest.approx(0.2)
    assert c.cpu_share("router") == pytest.approx(0.5)
    assert c.cpu_share("nginx") == pytest.approx(0.1)


def test_parse_result_reads_the_line_the_lua_script_prints() -> None:
    doc = {
        "requests": 812,
        "duration_us": 2_000_500,
        "seen": 812,
        "bad": 3,
        "errors": {"connect": 0, "read": 1, "write": 0, "status": 3, "timeout": 2},
        "histogram": [[3100, 400], [4100, 412]],
    }
    out = "Running 2s test @ http://x\n  1 threads\nmcpfleet-wrk " + json.dumps(doc) + "\n"
    res = parse_result(out)
    assert (res.requests, res.bad, res.socket_errors) == (812, 3, 3)
    assert res.seconds == pytest.approx(2.0005)
    assert res.histogram == {3100: 400, 4100: 412}
    assert res.p(0.99) == 4.1


def test_parse_result_refuses_output_without_the_result_line() -> None:
    with pytest.raises(ValueError, match="mcpfleet-wrk"):
        parse_result("Running 1s test\nRequests/sec: 100\n")


def test_net_commands_subtract_the_background_rate_over_the_window() -> None:
    from benchkit.sessionbench import net_commands

    before = {"get": 10, "set": 100, "sadd": 50}
    after = {"get": 1010, "set": 130, "sadd": 80, "ping": 3}
    background = {"set": 10.0, "sadd": 10.0}  # per second: heartbeats
    net = net_commands(before, after, background, seconds=3.0)
    assert net == {"get": 1000, "ping": 3}  # set and sadd were all background


def test_per_request_totals_and_names_each_command() -> None:
    from benchkit.sessionbench import _per_request

    total, detail = _per_request({"get": 1.0, "ping": 0.015}, 1000)
    assert total == "1.01"
    assert detail == "net: GET +1000, PING +15"
    assert _per_request({}, 1000) == ("0.00", "net: none")
    assert _per_request({"mget": -0.004}, 1000) == ("0.00", "net: MGET -4")


def test_collapsed_stacks_give_self_and_inclusive_shares() -> None:
    from benchkit.profile_summary import read_collapsed

    lines = [
        "main (a.py:1);Router._route (server/mcpfleet/router/proxy.py:10);leaf (b.py:3) 6",
        "main (a.py:1);Router._route (server/mcpfleet/router/proxy.py:12) 2",
        "main (a.py:2);f (c.py:4);f (c.py:9) 2",  # recursion counts once
        "not a stack line",
    ]
    prof = read_collapsed(lines)
    assert prof.samples == 10
    assert prof.top_self(2) == [
        ("leaf (b.py)", 0.6),
        ("Router._route (server/mcpfleet/router/proxy.py)", 0.2),
    ]
    assert prof.inclusive["main (a.py)"] == 10
    assert prof.inclusive["f (c.py)"] == 2
    assert prof.top_inclusive(1, within="server/mcpfleet/router/") == [
        ("Router._route (server/mcpfleet/router/proxy.py)", 0.8)
    ]


def test_relay_share_counts_the_pump_tasks_outside_relay() -> None:
    from benchkit.profile_summary import read_collapsed
    from benchkit.profilebench import relay_path_share

    prof = read_collapsed(
        [
            "run (u.py:1);Upstream.relay (server/mcpfleet/router/upstream.py:5) 3",
            "run (u.py:1);_pump.<locals>.copy (server/mcpfleet/router/upstream.py:9) 2",
            "run (u.py:1);Upstream.open (server/mcpfleet/router/upstream.py:2) 5",
        ]
    )
    assert relay_path_share(prof) == 0.5
