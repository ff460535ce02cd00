"""A real Prometheus scrapes a 3-replica fleet and its router through both eras and a rotation.

Then every query of every committed dashboard panel and every alert expression
is evaluated through Prometheus's HTTP API: each must return series (a query
naming a metric or label the code does not export fails), except queries over
the operator's metrics, which can only have data where the operator runs (a
cluster) and are listed with that reason. Finally no key of any ring the fleet
held appears, in any encoding, in any scrape or any label Prometheus stored.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from mcp_types import ElicitResult

from fleetkit import monitoring, scenarios
from fleetkit.clients.wire import initialize_body, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.localprom import LocalPrometheus
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import connect
from mcpfleet.keys.files import write_ring, write_volume
from mcpfleet.keys.ring import KeyRing
from mcpfleet.router.exchange import RequestOutcome
from mcpfleet.router.upstream import Failure

from .conftest import shared

#: Panels and alerts over the operator's metrics: they can only have data where the
#: operator runs (a cluster; the control-plane and kind tiers), never on a local fleet.
NEEDS_OPERATOR = "needs the operator (cluster)"
CLUSTER_ONLY_PANELS = {
    "mcpfleet / Key ring / Rotation phase",
    "mcpfleet / Key ring / Converged vs desired replicas",
    "mcpfleet / Key ring / Rotations by result",
    "mcpfleet / Key ring / Rotation phase duration p90",
    "mcpfleet / Key ring / Sealing key age",
    "mcpfleet / Key ring / Stalled rotations",
    "mcpfleet / Key ring / Tasks holding the old key",
    "mcpfleet / Key ring / Tasks abandoned by rotations",
}
CLUSTER_ONLY_ALERTS = {
    "McpfleetKeyRotationStuck",
    "McpfleetKeyRotationFailed",
    "McpfleetKeyRotationAbandonedTasks",
    "McpfleetKeyTooOld",
    "McpfleetOperatorDown",
}
#: Alerts on router outcomes a healthy local fleet never produces (every replica at its
#: session cap, upstream failures): each outcome they name must be one the router
#: emits, and their selectors without the outcome matcher must return series with
#: the labels they use.
#: Panels and alerts over the task metrics: only a replica whose app has task tools
#: exports them; tests/fleet/test_tasks.py checks them (make test-tasks).
NEEDS_TASKS = "needs an app with task tools (make test-tasks)"
TASKS_ONLY_PANELS = {
    "mcpfleet / Rounds / Tasks created and ended per tool",
    "mcpfleet / Rounds / Task failure ratio per tool",
    "mcpfleet / Rounds / Task queue: waiting and running",
    "mcpfleet / Rounds / Task input requests per tool",
    "mcpfleet / Routing / Task signals per replica",
}
TASKS_ONLY_ALERTS = {"McpfleetTaskQueueGrowing", "McpfleetTasksFailing"}
#: Panels and alerts over kube-state-metrics' HPA series: only a cluster runs it.
NEEDS_KSM = "needs kube-state-metrics and an HPA (cluster)"
KSM_ONLY_PANELS = {
    "mcpfleet / Routing / Server replicas: desired, current and max (HPA)",
    "mcpfleet / Routing / Router replicas: desired, current and max (HPA)",
    "mcpfleet / Routing / Triggers against their targets (HPA)",
    "mcpfleet / Routing / Trigger targets (HPA)",
}
KSM_ONLY_ALERTS = {"McpfleetAutoscalerAtMax"}
RARE_OUTCOME_ALERTS = {"McpfleetRouterErrorRatioHigh", "McpfleetSessionCapReached"}
ROUTER_OUTCOMES = {o.value for o in RequestOutcome} | {f.value for f in Failure}
_OUTCOME = re.compile(r',?\s*outcome=~?"([^"]*)"')

_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"")


@dataclass
class Observed:
    fleet: ProcessFleet
    prom: LocalPrometheus
    started: float
    rings: list[KeyRing] = field(default_factory=list)


def _metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _gauge(text: str, name: str) -> float | None:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


async def _answering(url: str, era: str, action: str, tool: str, args: dict[str, Any]) -> str:
    """One call whose every elicitation is answered with ``action`` (decline or cancel)."""

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return ElicitResult(action=action)  # type: ignore[arg-type]

    mode = "auto" if era == "modern" else "legacy"
    async with Client(
        StreamableHttpTransport(url), mode=mode, elicitation_handler=handler, timeout=30
    ) as client:
        return str((await client.call_tool(tool, args)).data)


async def _book(url: str, era: str, destination: str) -> None:
    async with connect(url, era) as client:  # type: ignore[arg-type]
        result = await client.call_tool("book_flight", {"destination": destination})
    assert str(result.data).startswith("Booked"), result.data


#: The example app's tool the traffic calls past its own rate (mcpfleet.limits).
LIMITED_TOOL = "weekly_report"


def _traffic(lf: ProcessFleet, prom: LocalPrometheus, rings: list[KeyRing]) -> None:
    """Both eras, declines, cancels, errors, rejections, a rotation, a refused ring, a death."""
    url = lf.url
    rings.append(lf.ring())

    async def eras() -> None:
        await asyncio.gather(*(_book(url, "modern", d) for d in ("Oslo", "Porto", "Riga")))
        await asyncio.gather(*(scenarios.handshake_session(url, f"t{i}") for i in range(2)))
        assert "declined" in await _answering(
            url, "modern", "decline", "book_flight", {"destination": "Rome"}
        )
        assert "cancelled" in await _answering(
            url, "handshake", "cancel", "book_flight", {"destination": "Rome"}
        )
        async with connect(url, "modern") as client:
            with pytest.raises(ToolError):  # fails validation: an error round
                await client.call_tool("book_flight", {"destination": "x"})

    asyncio.run(eras())
    # A tool with a rate of its own (the limits file): its second call is refused.
    limited = [modern_call(url, LIMITED_TOOL, {}).status for _ in range(2)]
    assert limited[-1] == 429, limited
    for state in ("v1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "garbage"):
        refused = modern_call(url, "book_flight", {"destination": "Oslo"}, request_state=state)
        assert refused.error is not None

    # A rotation, with modern traffic at each step so each kid seals and unseals.
    for step in ("stage", "promote"):
        ring = lf.rotate_step(step)
        rings.append(ring)
        lf.wait_attested(ring.kids)
        asyncio.run(_book(url, "modern", f"After {step}"))
    # A broken ring on disk: every replica refuses it and keeps the good one.
    good = lf.ring()
    write_volume(lf.keys_dir, {"keyring.json": b'{"version": 1, "keys": []}'})
    for member in lf.members.values():
        wait_for(
            lambda m=member: _gauge(_metrics_text(m.url), "mcpfleet_keyring_reload_failing") == 1,
            timeout=30,
            what=f"{member.name} to refuse the broken ring",
            retry_on=(Exception,),
        )
    write_ring(lf.keys_dir, good)
    retired = lf.rotate_step("retire")
    rings.append(retired)
    lf.wait_attested(retired.kids)
    asyncio.run(_book(url, "modern", "After retire"))

    # A handshake session whose owner dies: its next request gets the owner-gone 404.
    # Then a replica without sessions dies: stateless requests the router sends to it
    # before it leaves the registry are refused and resent to the last one.
    # First let every series so far reach Prometheus twice: a killed replica's
    # counters must already have the two samples a rate() needs.
    now = time.time()
    wait_for(
        lambda: prom.scraped_since(now),
        timeout=30,
        what="two scrapes of every replica",
        interval=0.2,
        retry_on=(Exception,),
    )
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    with httpx.Client(timeout=10) as http:
        init = http.post(url, content=initialize_body("prom-test"), headers=headers)
        session, owner = init.headers["mcp-session-id"], init.headers["x-mcpfleet-replica"]
        lf.kill(owner)
        gone = http.post(
            url,
            content=json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            headers={**headers, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"},
        )
        assert gone.status_code == 404
        lf.kill(next(n for n in lf.replica_names() if n != owner))
        router = f"http://127.0.0.1:{lf.router_ports[0]}"

        def resent() -> bool:
            modern_call(url, "book_flight", {"destination": "Oslo"}, client=http)
            return "mcpfleet_router_resends_total{" in _metrics_text(router)

        wait_for(
            resent,
            timeout=30,
            what="a stateless request resent past the dead replica",
            interval=0,
            retry_on=(Exception,),
        )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    monitoring.require_binary("prometheus")
    work = tmp_path_factory.mktemp("prom-fleet")
    limits = work / "limits.json"
    limits.write_text(json.dumps({"tools": {LIMITED_TOOL: {"rate": 0.01, "burst": 1}}}))
    options = FleetOptions(fleet="promtest", replica_args=("--limits-file", str(limits)))
    with local_fleet(work / "fleet", options) as lf, shared(lf):
        prom = LocalPrometheus(
            work / "prometheus", namespace=lf.fleet, interval=1.0, rules=[monitoring.RULES_FILE]
        )
        try:
            prom.start(lf.metrics_targets())
            wait_for(
                lambda: (
                    sum(t["health"] == "up" for t in prom.api("targets")["activeTargets"])
                    == len(lf.metrics_targets())
                ),
                timeout=30,
                what="Prometheus to scrape every process",
                interval=0.2,
                retry_on=(Exception,),
            )
            started = time.time()
            obs = Observed(lf, prom, started)
            _traffic(lf, prom, obs.rings)
            done = time.time()
            wait_for(
                lambda: prom.scraped_since(done),
                timeout=30,
                what="two scrapes after the traffic",
                interval=0.2,
                retry_on=(Exception,),
            )
            yield obs
        except BaseException:
            print(f"--- prometheus log ---\n{prom.tail()}")
            raise
        finally:
            prom.stop()


def _label_names(obs: Observed, metrics: set[str]) -> set[str]:
    names: set[str] = set()
    for metric in metrics:
        for series in obs.prom.api(
            "series", **{"match[]": metric, "start": f"{obs.started - 60:.0f}"}
        ):
            names.update(series)
    return names


def _labels_used(expr: str) -> set[str]:
    used = {
        name.strip() for group in _BY.findall(expr) for name in group.split(",") if name.strip()
    }
    used.update(_MATCHER.findall(expr))
    return used


def _check(obs: Observed, what: str, expr: str, metrics: set[str]) -> str | None:
    """Why ``expr`` fails against the fleet's data, or None when it returns series."""
    try:
        result = obs.prom.query_range(expr, obs.started, time.time(), 1.0)
    except Exception as exc:
        return f"{what}: Prometheus refused {expr!r}: {exc}"
    if not result:
        return f"{what}: no series for {expr!r}"
    missing = _labels_used(expr) - _label_names(obs, metrics)
    if missing:
        return f"{what}: labels {sorted(missing)} not exported on {sorted(metrics)}: {expr!r}"
    return None


def test_every_dashboard_query_returns_series(observed: Observed) -> None:
    failures, cluster_only, tasks_only, ksm_only = [], [], [], []
    queries = monitoring.panel_queries()
    assert len(queries) >= 30
    for q in queries:
        expr = monitoring.substitute(q.expr, observed.fleet.fleet)
        what = f"{q.dashboard} / {q.panel}"
        if q.needs_kube_state_metrics:
            observed.prom.query(expr)  # valid PromQL all the same (raises if not)
            ksm_only.append(what)
            continue
        if q.needs_tasks:
            observed.prom.query(expr)  # valid PromQL all the same (raises if not)
            tasks_only.append(what)
            continue
        if q.needs_operator:
            observed.prom.query(expr)  # valid PromQL all the same (raises if not)
            cluster_only.append(what)
            continue
        problem = _check(observed, what, expr, q.metrics)
        if problem:
            failures.append(problem)
    print("\n".join(f"{c}: {NEEDS_OPERATOR}" for c in sorted(set(cluster_only))))
    print("\n".join(f"{c}: {NEEDS_TASKS}" for c in sorted(set(tasks_only))))
    print("\n".join(f"{c}: {NEEDS_KSM}" for c in sorted(set(ksm_only))))
    assert failures == [], "\n".join(failures)
    assert set(cluster_only) == CLUSTER_ONLY_PANELS
    assert set(tasks_only) == TASKS_ONLY_PANELS
    assert set(ksm_only) == KSM_ONLY_PANELS


def test_every_alert_expression_is_valid_and_names_exported_series(observed: Observed) -> None:
    failures, cluster_only, tasks_only, ksm_only = [], [], [], []
    for alert in monitoring.alerts():
        observed.prom.query(alert.expr)  # the whole expression evaluates (raises if not)
        if monitoring.needs_tasks(alert.expr):
            tasks_only.append(alert.name)
            continue
        if monitoring.needs_kube_state_metrics(alert.expr):
            ksm_only.append(alert.name)
            continue
        for selector in alert.selectors():
            metric = selector.split("{")[0]
            if monitoring.needs_operator(selector):
                cluster_only.append(alert.name)
                continue
            outcome = _OUTCOME.search(selector)
            if alert.name in RARE_OUTCOME_ALERTS and outcome:
                unknown = set(outcome.group(1).split("|")) - ROUTER_OUTCOMES
                if unknown:
                    failures.append(f"{alert.name}: {sorted(unknown)} are not router outcomes")
                selector = _OUTCOME.sub("", selector, count=1).replace("{,", "{")
                selector = selector.replace("{}", "")
            problem = _check(observed, alert.name, selector, {metric})
            if problem:
                failures.append(problem)
        metrics = {s.split("{")[0] for s in alert.selectors()}
        if monitoring.needs_operator(alert.expr):
            cluster_only.append(alert.name)
        else:
            missing = _labels_used(alert.expr) - _label_names(observed, metrics)
            if missing:
                failures.append(f"{alert.name}: labels {sorted(missing)} not exported")
    print("\n".join(f"{c}: {NEEDS_OPERATOR}" for c in sorted(set(cluster_only))))
    print("\n".join(f"{c}: {NEEDS_TASKS}" for c in sorted(set(tasks_only))))
    print("\n".join(f"{c}: {NEEDS_KSM}" for c in sorted(set(ksm_only))))
    assert failures == [], "\n".join(failures)
    assert set(cluster_only) == CLUSTER_ONLY_ALERTS
    assert set(tasks_only) == TASKS_ONLY_ALERTS
    assert set(ksm_only) == KSM_ONLY_ALERTS


def test_prometheus_loads_and_evaluates_every_alert_rule(observed: Observed) -> None:
    groups = observed.prom.api("rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"] if r["type"] == "alerting"}
    assert set(rules) == {a.name for a in monitoring.alerts()}
    wait_for(
        lambda: all(
            r.get("lastEvaluation", "").startswith("20")
            for g in observed.prom.api("rules")["groups"]
            for r in g["rules"]
        ),
        timeout=30,
        what="every rule to be evaluated",
        retry_on=(Exception,),
    )
    for g in observed.prom.api("rules")["groups"]:
        for r in g["rules"]:
            assert r["health"] == "ok", (r["name"], r.get("lastError"))


def _encodings(secret: bytes) -> set[bytes]:
    """A key as the code could ever write it: raw, hex, base64 and base64url, padded or not."""
    b64 = base64.b64encode(secret)
    b64u = base64.urlsafe_b64encode(secret)
    return {
        secret,
        b64,
        b64.rstrip(b"="),
        b64u,
        b64u.rstrip(b"="),
        secret.hex().encode(),
        secret.hex().upper().encode(),
    }


def _scrape(url: str) -> bytes:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        body: bytes = resp.read()
        return body


def test_no_key_material_in_any_metric_or_stored_label(observed: Observed) -> None:
    lf = observed.fleet
    secrets = {key.secret for ring in observed.rings for key in ring.keys}
    assert len(secrets) >= 2, "the rotation added a key"
    bodies = {m.name: _scrape(m.url) for m in lf.members.values() if m.proc.alive}
    for i, port in enumerate(lf.router_ports):
        bodies[f"router-{i}"] = _scrape(f"http://127.0.0.1:{port}")
    # The replicas killed after the rotation are no longer scrapable: what they
    # exported is in Prometheus, whose every stored label value is searched too.
    labels = observed.prom.api("labels")
    values = {name: observed.prom.api(f"label/{name}/values") for name in labels}
    bodies["prometheus labels"] = json.dumps(values, ensure_ascii=False).encode()
    kids = {kid for ring in observed.rings for kid in ring.kids}
    assert kids & set(values.get("kid", [])), "unseals by kid reached Prometheus"
    for where, body in bodies.items():
        for secret in secrets:
            for encoded in _encodings(secret):
                assert encoded not in body, f"key material in {where}"


def test_replicas_export_what_the_fleet_did(observed: Observed) -> None:
    """A spot check of the fleet-wide sums (killed replicas included): they match the traffic."""
    q = observed.prom.query
    ns = observed.fleet.fleet
    rounds = q(
        "sum by (era, kind) (max_over_time("
        f'mcpfleet_rounds_total{{namespace="{ns}",component="book_flight"}}[10m]))'
    )
    seen = {(r["metric"]["era"], r["metric"]["kind"]): float(r["value"][1]) for r in rounds}
    assert seen[("handshake", "asking")] >= 1 and seen[("modern", "asking")] >= 9
    assert seen[("modern", "final")] >= 6
    ever = 'max_over_time({}{{namespace="' + ns + '"}}[10m])'
    answers = q(f"sum by (action) ({ever.format('mcpfleet_elicitation_responses_total')})")
    actions = {r["metric"]["action"] for r in answers}
    assert {"accept", "decline", "cancel"} <= actions
    rejected = q(f"sum by (reason) ({ever.format('mcpfleet_requeststate_rejections_total')})")
    assert {r["metric"]["reason"] for r in rejected} >= {"malformed"}
