"""The bench's targets' table: each target judged on the figures it names, PASS or FAIL."""

from __future__ import annotations

from benchkit import routercost
from benchkit.loadgen import WrkResult
from benchkit.roundcost import (
    JSON_MODE,
    PLAIN_JSON,
    PLAIN_SSE,
    REPLICA,
    REPLICA_DEFAULTS,
    REPLICA_ONCE,
    SSE_MODE,
    Server,
)
from benchkit.summary import render_summary, summary_rows


def server(name: str, mode: str, ask_us: float, answer_us: float, answer_ms: float) -> Server:
    s = Server(name, "http://x/mcp", "confirm", 1, mode=mode)
    s.asks = s.answers = 100
    s.ask_ns, s.answer_ns = int(ask_us * 1e3 * 100), int(answer_us * 1e3 * 100)
    s.ask_ms, s.answer_ms = [1.0] * 100, [answer_ms] * 100
    return s


def wrk(p50_us: int, requests: int = 1000, cpu: dict[str, float] | None = None) -> WrkResult:
    return WrkResult(requests=requests, seconds=1.0, histogram={p50_us: 100}, cpu=cpu or {})


def test_each_target_is_judged_on_its_own_ratio_and_the_replicas_mode() -> None:
    servers = {
        PLAIN_JSON: server(PLAIN_JSON, JSON_MODE, 1000, 1000, 2.0),
        PLAIN_SSE: server(PLAIN_SSE, SSE_MODE, 2000, 2000, 2.0),
        REPLICA: server(REPLICA, JSON_MODE, 1100, 1200, 2.0),
        REPLICA_ONCE: server(REPLICA_ONCE, JSON_MODE, 1100, 1250, 2.2),
        REPLICA_DEFAULTS: server(REPLICA_DEFAULTS, JSON_MODE, 1000, 1300, 2.0),
    }
    setups, targets = summary_rows(servers, None)
    verdicts = {t[0]: (t[1], t[3]) for t in targets}
    # Compared with plain FastMCP in JSON mode (the replica's), not SSE mode.
    assert verdicts["replica CPU per asking round <= x1.00 plain FastMCP"] == ("x1.10", "FAIL")
    assert verdicts["replica CPU per answer round <= x1.00 plain FastMCP"] == ("x1.20", "FAIL")
    # The replica as a user gets it (limits, notifications, tracing at their defaults).
    user = "replica as a user gets it CPU per"
    assert verdicts[f"{user} asking round <= x1.00 plain FastMCP"] == ("x1.00", "PASS")
    assert verdicts[f"{user} answer round <= x1.00 plain FastMCP"] == ("x1.30", "FAIL")
    assert any(r[0].startswith(REPLICA_DEFAULTS) for r in setups)
    assert verdicts["once=True adds <= 100 us CPU to the answer round"] == ("+50 us", "PASS")
    assert verdicts["once=True adds <= 0.3 ms p50 to the answer round"] == ("+0.20 ms", "PASS")


def test_the_router_targets_use_nginxs_overhead_from_the_same_run() -> None:
    fig = routercost.Figures()
    for conns, (direct, router, nginx) in {
        1: (1000, 1500, 1400),
        8: (2000, 3000, 2500),
        64: (9000, 9500, 9400),
    }.items():
        fig.modern[(routercost.DIRECT, conns)] = wrk(direct)
        fig.modern[(routercost.ROUTER, conns)] = wrk(router, cpu={routercost.ROUTER: 0.25})
        fig.modern[(routercost.NGINX, conns)] = wrk(nginx, cpu={routercost.NGINX: 0.1})
    fig.sticky[routercost.DIRECT] = wrk(1000)
    fig.sticky[routercost.ROUTER] = wrk(1700)
    setups, targets = summary_rows(None, fig)
    verdicts = {t[0]: (t[1], t[3]) for t in targets}
    assert verdicts["router CPU <= 300 us per modern round"] == ("250 us", "PASS")
    # 1 conn: +0.50 vs nginx +0.40 + 0.2; 8 conn: +1.00 vs +0.50 + 0.2; 64: +0.50 vs +0.6.
    assert verdicts["router p50 overhead <= nginx's + 0.2 ms, 1 conn"][1] == "PASS"
    assert verdicts["router p50 overhead <= nginx's + 0.2 ms, 8 conn"][1] == "FAIL"
    assert verdicts["router p50 overhead <= nginx's + 0.2 ms, 64 conn"][1] == "PASS"
    # Sticky: +0.70 ms vs 1.2 x (0.40 + 0.2) = 0.72 ms.
    assert verdicts["sticky request overhead <= x1.2 that bound (1 conn)"] == ("+0.70 ms", "PASS")
    router_row = next(r for r in setups if r[0].startswith("mcpfleet router"))
    assert router_row[1].startswith("250 us") and router_row[4].startswith("4000")
    assert "FAIL" in render_summary(None, fig)
