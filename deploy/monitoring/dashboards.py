"""mcpfleet's Grafana dashboards, as code (grafana-foundation-sdk's typed builders).

Run ``python deploy/monitoring/dashboards.py`` (or ``make dashboards``) to
regenerate ``charts/mcpfleet/dashboards/*.json``; ``--check`` exits non-zero
when the committed files differ from what this generates. The JSON is
committed because the chart ships it as ConfigMaps for Grafana's sidecar and
a person may import it by hand; a unit test proves it is this file's output,
byte for byte.

Every panel has a description and a unit, every query filters on the
``$namespace`` variable and reads the ``$datasource`` variable, and rates use
``$__rate_interval``. Per-process breakdowns use the ``pod`` target label (a
ServiceMonitor adds it; the local Prometheus of ``mcpfleet dev`` sets it to the
process name). Panels over ``mcpfleet_operator_*`` show data once the operator
runs (a cluster).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import table as gtable
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "charts" / "mcpfleet" / "dashboards"

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
NS = 'namespace=~"$namespace"'
RATE = "$__rate_interval"
TAGS = ["mcpfleet"]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    table: bool = False


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # timeseries | stat | table
    width: int = 12
    height: int = 8
    #: The queries ask for exemplars, each linked to its trace in ``$tracing``
    #: (a histogram whose observations carry a ``trace_id`` exemplar).
    traces: bool = False


#: Where an exemplar's trace opens: Explore on the ``$tracing`` data source, looking
#: up the exemplar's ``trace_id`` (Tempo's TraceQL trace id query; Jaeger's and
#: Zipkin's data sources take the id as the query too).
TRACE_URL = (
    '/explore?left={"datasource":"${tracing}","queries":[{"refId":"A",'
    '"queryType":"traceql","query":"${__data.fields.trace_id}"}]}'
)


def _target(q: Query, ref: str, exemplars: bool = False) -> gp.Dataquery:
    t = gp.Dataquery().expr(q.expr).ref_id(ref).datasource(DATASOURCE)
    if exemplars:
        t = t.exemplar(True)
    t = t.instant().format(PromQueryFormat.TABLE) if q.table else t.range()
    if q.legend:
        t = t.legend_format(q.legend)
    return t


def _panel(spec: PanelSpec) -> Any:
    builders: dict[str, Callable[[], Any]] = {
        "timeseries": gts.Panel,
        "stat": gstat.Panel,
        "table": gtable.Panel,
    }
    p = (
        builders[spec.kind]()
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .span(spec.width)
        .height(spec.height)
    )
    for i, q in enumerate(spec.queries):
        p = p.with_target(_target(q, chr(ord("A") + i), spec.traces))
    if spec.traces:
        p = p.data_links([gd.DashboardLink("Trace ${__data.fields.trace_id}").url(TRACE_URL)])
    return p


def _variables(d: gd.Dashboard, traces: bool) -> gd.Dashboard:
    """``$datasource`` and ``$namespace``; ``$tracing`` too where a panel links to traces."""
    d = d.with_variable(
        gd.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes the fleet.")
    )
    if traces:
        d = d.with_variable(
            gd.DatasourceVariable("tracing")
            .label("Traces")
            .type("tempo")
            .description(
                "The tracing backend the fleet exports to (docs/observability.md#traces): a "
                "latency panel's exemplars open their trace there."
            )
        )
    return d.with_variable(
        gd.QueryVariable("namespace")
        .label("Namespace")
        .description("The namespace (fleet) whose replicas, routers and operator are shown.")
        .datasource(DATASOURCE)
        .query("label_values(mcpfleet_replica_build_info, namespace)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def build(
    uid: str, title: str, description: str, rows: list[tuple[str, list[PanelSpec]]]
) -> dict[str, Any]:
    d = (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
    )
    d = _variables(d, any(spec.traces for _, panels in rows for spec in panels))
    ids = iter(range(1, 1000))
    for row_title, panels in rows:
        d = d.with_row(gd.Row(row_title).id(next(ids)))
        for spec in panels:
            d = d.with_panel(_panel(spec).id(next(ids)))
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def _rate(metric: str, by: str, where: str = "") -> str:
    """``sum by (by)`` (or a plain ``sum`` when ``by`` is empty) of a counter's rate."""
    sel = f"{NS},{where}" if where else NS
    agg = f"sum by ({by}) " if by else "sum"
    return f"{agg}(rate({metric}{{{sel}}}[{RATE}]))"


def _quantile(q: float, metric: str, by: str, where: str = "") -> str:
    sel = f"{NS},{where}" if where else NS
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RATE}])))"


def _pct(q: float) -> str:
    return f"p{round(q * 100)}"


NOT_OK = 'outcome!="ok"'

# --- mcpfleet / Rounds ------------------------------------------------------------------

ROUNDS = "mcpfleet_rounds_total"
ANSWERS = "mcpfleet_elicitation_responses_total"
ROUND_SECONDS = "mcpfleet_round_duration_seconds"


def rounds_dashboard() -> dict[str, Any]:
    return build(
        "mcpfleet-rounds",
        "mcpfleet / Rounds",
        "Asking versus final rounds of every tool, prompt and resource, in both protocol eras.",
        [
            (
                "Rounds",
                [
                    PanelSpec(
                        "Asking vs final rounds per component",
                        "Rounds per second by component and kind: asking rounds request input "
                        "(an InputRequiredResult, or an elicitation on a handshake-era session); "
                        "final rounds answer.",
                        "ops",
                        (
                            Query(
                                _rate(ROUNDS, "component_type, component, kind"),
                                "{{component_type}} {{component}} {{kind}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Asking rounds per final round",
                        "How many times, on average, each component asks before it answers. "
                        "A rise means users are asked more (or answer fewer) questions.",
                        "none",
                        (
                            Query(
                                _rate(ROUNDS, "component", 'kind="asking"')
                                + " / "
                                + _rate(ROUNDS, "component", 'kind="final"'),
                                "{{component}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Rounds by era",
                        "Rounds per second on modern (2026-07-28, stateless) and handshake-era "
                        "(sticky session) connections.",
                        "ops",
                        (Query(_rate(ROUNDS, "era, kind"), "{{era}} {{kind}}"),),
                    ),
                    PanelSpec(
                        "Calls started vs continued",
                        "Rounds that start a call versus rounds that continue one after the "
                        "client answered (modern: the request carried input responses or "
                        "request state).",
                        "ops",
                        (Query(_rate(ROUNDS, "era, step"), "{{era}} {{step}}"),),
                    ),
                ],
            ),
            (
                "Latency",
                [
                    PanelSpec(
                        "Round latency quantiles by kind",
                        "Server time per round (the user's answering time excluded), p50, p90 "
                        "and p99, for asking and final rounds.",
                        "s",
                        tuple(
                            Query(_quantile(q, ROUND_SECONDS, "kind"), _pct(q) + " {{kind}}")
                            for q in (0.5, 0.9, 0.99)
                        ),
                    ),
                    PanelSpec(
                        "Round latency p99 per component",
                        "The slowest rounds, per component and kind. With tracing on, the "
                        "points over the lines are exemplars: one traced round each, linked "
                        "to its trace in the Traces data source.",
                        "s",
                        (
                            Query(
                                _quantile(0.99, ROUND_SECONDS, "component_type, component, kind"),
                                "{{component_type}} {{component}} {{kind}}",
                            ),
                        ),
                        traces=True,
                    ),
                ],
            ),
            (
                "Answers and errors",
                [
                    PanelSpec(
                        "Elicitation answers by action",
                        "Clients' answers to elicitations per second: accept, decline or cancel, "
                        "by era.",
                        "ops",
                        (Query(_rate(ANSWERS, "era, action"), "{{era}} {{action}}"),),
                    ),
                    PanelSpec(
                        "Decline and cancel share per component",
                        "The share of elicitation answers that declined or cancelled: users "
                        "walking away from a flow.",
                        "percentunit",
                        (
                            Query(
                                _rate(ANSWERS, "component", 'action=~"decline|cancel"')
                                + " / "
                                + _rate(ANSWERS, "component"),
                                "{{component}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Error rounds",
                        "Rounds per second that ended in an error (a tool error, a failed "
                        "validation, an unknown component) or were aborted (the client left).",
                        "ops",
                        (
                            Query(
                                _rate(ROUNDS, "component_type, component, outcome", NOT_OK),
                                "{{component_type}} {{component}} {{outcome}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Error ratio",
                        "The share of all rounds that did not end ok.",
                        "percentunit",
                        (Query(_rate(ROUNDS, "", 'outcome!="ok"') + " / " + _rate(ROUNDS, "")),),
                        kind="stat",
                    ),
                ],
            ),
            tasks_row(),
            limits_row(),
            notifications_row(),
        ],
    )


# --- the Limits row (mcpfleet / Rounds): limits per principal (docs/limits.md) ----------

LIMITED = "mcpfleet_limited_total"


def limits_row() -> tuple[str, list[PanelSpec]]:
    """Panels over ``mcpfleet_limited_total`` and the limits' gauges."""
    return (
        "Limits",
        [
            PanelSpec(
                "Requests refused under a limit",
                "Requests per second answered 429 under a limit per principal, by limit "
                "(sessions, rounds) and tool. Sustained refusals fire McpfleetLimitingSustained; "
                "the replicas' log names the refused principal's digest once a minute.",
                "ops",
                (Query(_rate(LIMITED, "limit, tool"), "{{limit}} {{tool}}"),),
            ),
            PanelSpec(
                "Principals refused in the last minute",
                "Principals a replica refused within the last minute, by limit (every replica "
                "counts its own: the highest reading is shown).",
                "short",
                (
                    Query(
                        f"max by (limit) (mcpfleet_limit_principals_limited{{{NS}}})",
                        "{{limit}}",
                    ),
                ),
            ),
            PanelSpec(
                "Limit checks Redis could not answer",
                "Limit checks per second answered from a replica's memory because Redis failed "
                "or passed the deadline (rounds: the rate per replica; sessions: the replica's "
                "own count).",
                "ops",
                (Query(_rate("mcpfleet_limit_checks_failed_total", "limit"), "{{limit}}"),),
            ),
        ],
    )


# --- the Tasks row (mcpfleet / Rounds): MCP tasks of apps with task tools -----------------

TASKS_CREATED = "mcpfleet_tasks_created_total"
TASKS_FINISHED = "mcpfleet_tasks_finished_total"
TASKS_FAILING = 'status=~"failed|error"'


def tasks_row() -> tuple[str, list[PanelSpec]]:
    """Panels over ``mcpfleet_tasks_*``: data only where the app has task tools."""
    return (
        "Tasks",
        [
            PanelSpec(
                "Tasks created and ended per tool",
                "MCP tasks per second: created (answered with a CreateTaskResult) and ended, by "
                "tool and status (completed; error: the tool raised; failed: the engine failed "
                "it; cancelled). Only apps with task tools have them.",
                "ops",
                (
                    Query(_rate(TASKS_CREATED, "tool"), "{{tool}} created"),
                    Query(_rate(TASKS_FINISHED, "tool, status"), "{{tool}} {{status}}"),
                ),
            ),
            PanelSpec(
                "Task failure ratio per tool",
                "The share of each tool's ended tasks that failed or ended with an error "
                "(McpfleetTasksFailing fires past 10%).",
                "percentunit",
                (
                    Query(
                        _rate(TASKS_FINISHED, "tool", TASKS_FAILING)
                        + " / "
                        + _rate(TASKS_FINISHED, "tool"),
                        "{{tool}}",
                    ),
                ),
            ),
            PanelSpec(
                "Task queue: waiting and running",
                "Tasks waiting for a worker in the fleet's queue (every replica reads the same "
                "queue: the highest reading is shown) and task executions the workers run, per "
                "replica. A queue that only grows means the workers do not keep up "
                "(McpfleetTaskQueueGrowing).",
                "short",
                (
                    Query(f"max(mcpfleet_tasks_queue_depth{{{NS}}})", "waiting"),
                    Query(f"sum by (pod) (mcpfleet_tasks_running{{{NS}}})", "running {{pod}}"),
                ),
            ),
            PanelSpec(
                "Task input requests per tool",
                "Task legs per second that ended asking the user for input (input_required, "
                "answered with tasks/update).",
                "ops",
                (Query(_rate("mcpfleet_tasks_input_requests_total", "tool"), "{{tool}}"),),
            ),
        ],
    )


# --- the Notifications row (mcpfleet / Rounds): listen streams and the fleet bus ---------

EVENTS_DROPPED = "mcpfleet_events_dropped_total"
FANOUT = "mcpfleet_events_fanout_seconds"


def notifications_row() -> tuple[str, list[PanelSpec]]:
    """Panels over ``mcpfleet_listen_streams`` and ``mcpfleet_events_*`` (docs/notifications.md)."""
    return (
        "Notifications",
        [
            PanelSpec(
                "Listen streams open",
                "subscriptions/listen streams open, per replica (each replica serves at most "
                "--listen-streams; a principal holds at most server.limits.listen fleet-wide).",
                "short",
                (Query(f"sum by (pod) (mcpfleet_listen_streams{{{NS}}})", "{{pod}}"),),
            ),
            PanelSpec(
                "Events published and delivered by kind",
                "Events per second put on the fleet's bus (by the replica where they happened) "
                "and frames written to listen streams, by kind (tools, prompts, resources list "
                "changes; resource updates; task status).",
                "ops",
                (
                    Query(_rate("mcpfleet_events_published_total", "kind"), "published {{kind}}"),
                    Query(_rate("mcpfleet_events_delivered_total", "kind"), "delivered {{kind}}"),
                ),
            ),
            PanelSpec(
                "Events dropped by reason",
                "Events per second that reached no stream: redis (a publish Redis did not take "
                "within the deadline, or a task status not read), slow (a stream ended at its "
                "buffer's bound), malformed (a frame that is not an event), store (a handshake "
                "session's SSE event Redis did not store: sent live without an id, not "
                "resumable). Any drop fires McpfleetEventsDropped.",
                "ops",
                (Query(_rate(EVENTS_DROPPED, "reason"), "{{reason}}"),),
            ),
            PanelSpec(
                "Fan-out latency",
                "From an event's publication, on any replica, to its arrival on each replica "
                "(p50, p99).",
                "s",
                tuple(
                    Query(_quantile(q, FANOUT, "pod"), f"{_pct(q)} {{{{pod}}}}")
                    for q in (0.5, 0.99)
                ),
            ),
        ],
    )


# --- mcpfleet / Key ring ----------------------------------------------------------------


def keyring_dashboard() -> dict[str, Any]:
    op = 'namespace=~"$namespace"'
    return build(
        "mcpfleet-keyring",
        "mcpfleet / Key ring",
        "The request-state key ring: what each replica loaded, rotations, and which keys "
        "seal and open tokens.",
        [
            (
                "Replicas",
                [
                    PanelSpec(
                        "Kids per replica",
                        "The ordered key ids each replica has loaded (the first seals) and the "
                        "ring's rotation phase. Every replica should show the same kids.",
                        "none",
                        (
                            Query(
                                f"max by (pod, kids, phase) (mcpfleet_keyring_info{{{NS}}})",
                                table=True,
                            ),
                        ),
                        kind="table",
                    ),
                    PanelSpec(
                        "Distinct key rings",
                        "How many different rings the replicas hold: 1 when converged, 2 for "
                        "the seconds a rotation step takes to reach every replica.",
                        "none",
                        (Query(f"count(count by (kids) (mcpfleet_keyring_info{{{NS}}}))"),),
                        kind="stat",
                        width=6,
                    ),
                    PanelSpec(
                        "Replicas refusing the ring on disk",
                        "Replicas whose newest key ring on disk failed to load (they keep "
                        "serving with their last good ring).",
                        "none",
                        (Query(f"sum(mcpfleet_keyring_reload_failing{{{NS}}})"),),
                        kind="stat",
                        width=6,
                    ),
                    PanelSpec(
                        "Key ring reloads by result",
                        "New ring versions each replica saw on disk: loaded, unchanged or "
                        "refused (error).",
                        "short",
                        (
                            Query(
                                f"sum by (pod, result) "
                                f"(increase(mcpfleet_keyring_reloads_total{{{NS}}}[{RATE}]))",
                                "{{pod}} {{result}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Time since the ring in use was loaded",
                        "Per replica, how long ago its current ring was loaded.",
                        "s",
                        (
                            Query(
                                "time() - max by (pod) "
                                f"(mcpfleet_keyring_last_reload_timestamp_seconds{{{NS}}})",
                                "{{pod}}",
                            ),
                        ),
                    ),
                ],
            ),
            (
                "Rotations (operator)",
                [
                    PanelSpec(
                        "Rotation phase",
                        "The phase each key ring's rotation is in (1 = current); idle when "
                        "none runs. From the operator.",
                        "none",
                        (
                            Query(
                                "max by (keyring, phase) "
                                f"(mcpfleet_operator_rotation_phase{{{op}}}) == 1",
                                "{{keyring}} {{phase}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Converged vs desired replicas",
                        "Replicas attesting the ring the operator wants, against the replicas "
                        "it expects. From the operator.",
                        "none",
                        (
                            Query(
                                f"max by (keyring, state) (mcpfleet_operator_replicas{{{op}}})",
                                "{{keyring}} {{state}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Rotations by result",
                        "Rotations finished in the dashboard's time range: complete, failed or "
                        "aborted. From the operator.",
                        "short",
                        (
                            Query(
                                "sum by (keyring, result) "
                                f"(increase(mcpfleet_operator_rotations_total{{{op}}}[$__range]))",
                                "{{keyring}} {{result}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Rotation phase duration p90",
                        "How long each rotation phase takes (staging, promoting, waiting, "
                        "retiring). From the operator.",
                        "s",
                        (
                            Query(
                                _quantile(0.9, "mcpfleet_operator_phase_duration_seconds", "phase"),
                                "{{phase}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Sealing key age",
                        "Age of the key that seals, per key ring. From the operator.",
                        "s",
                        (
                            Query(
                                f"max by (keyring) (mcpfleet_operator_key_age_seconds{{{op}}})",
                                "{{keyring}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Stalled rotations",
                        "1 while a rotation step waits past its deadline for replicas to "
                        "converge; and stalls counted. From the operator.",
                        "none",
                        (
                            Query(
                                f"max by (keyring) (mcpfleet_operator_stalled{{{op}}})",
                                "{{keyring}} stalled",
                            ),
                            Query(
                                "sum by (keyring) "
                                f"(increase(mcpfleet_operator_stalls_total{{{op}}}[$__range]))",
                                "{{keyring}} stalls",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Tasks holding the old key",
                        "Live MCP tasks whose stored snapshot the old key sealed, while a "
                        "rotation's retire step waits for them (replicas with --tasks-encrypt); "
                        "0 otherwise. The old key goes at 0, or at the tasks wait limit "
                        "(operator.tasksWaitLimit) after the token TTL, failing those left. "
                        "From the operator.",
                        "short",
                        (
                            Query(
                                f"max by (keyring) (mcpfleet_operator_old_key_tasks{{{op}}})",
                                "{{keyring}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Tasks abandoned by rotations",
                        "Live MCP tasks under the old key when a rotation retired it at the "
                        "tasks wait limit, in the dashboard's time range: they failed "
                        "(McpfleetKeyRotationAbandonedTasks). From the operator.",
                        "short",
                        (
                            Query(
                                "sum by (keyring) (increase("
                                f"mcpfleet_operator_tasks_abandoned_total{{{op}}}[$__range]))",
                                "{{keyring}}",
                            ),
                        ),
                    ),
                ],
            ),
            (
                "Request state",
                [
                    PanelSpec(
                        "Unseals by kid",
                        "Tokens opened per second, by the key that opened them. When a retired "
                        "key's line reaches zero, no client holds its tokens any more.",
                        "ops",
                        (Query(_rate("mcpfleet_requeststate_unseals_total", "kid"), "{{kid}}"),),
                    ),
                    PanelSpec(
                        "Seals by kid",
                        "Tokens sealed per second, by the sealing key: after a promotion, only "
                        "the new kid.",
                        "ops",
                        (Query(_rate("mcpfleet_requeststate_seals_total", "kid"), "{{kid}}"),),
                    ),
                    PanelSpec(
                        "Rejections by reason",
                        "Request-state tokens refused per second: expired, tampered, unknown "
                        "kid (a key retired too early, or a foreign ring), audience, malformed.",
                        "ops",
                        (
                            Query(
                                _rate("mcpfleet_requeststate_rejections_total", "reason"),
                                "{{reason}}",
                            ),
                        ),
                        width=24,
                    ),
                ],
            ),
        ],
    )


# --- the Autoscaling row (mcpfleet / Routing): the HPA KEDA makes, and its signals ---------

#: The HorizontalPodAutoscaler of a fleet's servers (routers) is named like their
#: Deployment, ``<fullname>-server`` (``-router``): the ScaledObject's
#: ``advanced.horizontalPodAutoscalerConfig.name``, or the chart's own CPU HPA. That is
#: also the ``job`` label the chart's ServiceMonitor gives their metrics, so the HPAs of
#: the fleets shown are those whose name is a job of these metrics: no regex on names,
#: no other HPA of the namespace.
SERVER_JOBS = f"max by (namespace, job) (mcpfleet_replica_build_info{{{NS}}})"
ROUTER_JOBS = f"max by (namespace, job) (mcpfleet_router_replicas{{{NS}}})"


def _hpa_of(jobs: str) -> str:
    """The fleet's jobs relabelled as HPA names, to join kube-state-metrics' HPA series."""
    return f'label_replace({jobs}, "horizontalpodautoscaler", "$1", "job", "(.+)")'


def _hpa(metric: str, jobs: str) -> str:
    """A kube-state-metrics HPA series of the fleet's HPAs only (``and on`` their names)."""
    return (
        f"max by (horizontalpodautoscaler) (kube_horizontalpodautoscaler_{metric}{{{NS}}} "
        f"and on (namespace, horizontalpodautoscaler) {_hpa_of(jobs)})"
    )


#: Each trigger's current value over its target, as the HPA computes them
#: (kube-state-metrics' status and spec target metrics, matched per metric and type).
HPA_RATIO = (
    "max by (horizontalpodautoscaler, metric_name) ("
    f"(kube_horizontalpodautoscaler_status_target_metric{{{NS}}} "
    "/ on (namespace, horizontalpodautoscaler, metric_name, metric_target_type) "
    f"kube_horizontalpodautoscaler_spec_target_metric{{{NS}}}) "
    f"and on (namespace, horizontalpodautoscaler) {_hpa_of(SERVER_JOBS + ' or ' + ROUTER_JOBS)})"
)
HPA_TARGETS = (
    "max by (horizontalpodautoscaler, metric_name, metric_target_type) ("
    f"kube_horizontalpodautoscaler_spec_target_metric{{{NS}}} "
    f"and on (namespace, horizontalpodautoscaler) {_hpa_of(SERVER_JOBS + ' or ' + ROUTER_JOBS)})"
)
#: The replicas a per-replica signal is divided by: those scraped, per fleet (the HPA
#: divides by the Deployment's replicas; they differ while a Pod starts or drains).
REPLICAS = f"count by (namespace, job) (mcpfleet_replica_build_info{{{NS}}})"


def _per_replica(agg: str, metric: str) -> str:
    """A ScaledObject's query over the replicas (``sum`` or ``max``) divided by the replicas."""
    return f"{agg} by (namespace, job) ({metric}{{{NS}}}) / {REPLICAS}"


def _replicas_panel(component: str, jobs: str) -> PanelSpec:
    return PanelSpec(
        f"{component.capitalize()} replicas: desired, current and max (HPA)",
        f"The {component}s' HorizontalPodAutoscaler (<fullname>-{component}, made by KEDA with "
        f"{component}.autoscaling.mcp, else the chart's CPU HPA): the replicas it wants, "
        "those it has, and its maxReplicas. Desired above current is a scale-out under "
        "way; current at max with a trigger over its target is McpfleetAutoscalerAtMax. "
        "From kube-state-metrics.",
        "short",
        (
            Query(_hpa("status_desired_replicas", jobs), "{{horizontalpodautoscaler}} desired"),
            Query(_hpa("status_current_replicas", jobs), "{{horizontalpodautoscaler}} current"),
            Query(_hpa("spec_max_replicas", jobs), "{{horizontalpodautoscaler}} max"),
        ),
    )


def autoscaling_row() -> tuple[str, list[PanelSpec]]:
    """The HPA's replicas and each signal against its target (docs/autoscaling.md).

    The targets are the chart's values, different per release, while the dashboards
    are one JSON for every release: they are read from the HPA itself, through
    kube-state-metrics, and the signals are computed here as the ScaledObject's queries.
    """
    return (
        "Autoscaling",
        [
            _replicas_panel("server", SERVER_JOBS),
            _replicas_panel("router", ROUTER_JOBS),
            PanelSpec(
                "Triggers against their targets (HPA)",
                "Each metric of the HPAs as the HPA reads it, over its target: 1 is at the "
                "target; over 1 (1.1 with the HPA's default tolerance) the HPA adds replicas "
                "unless it is at maxReplicas. KEDA names its Prometheus triggers s0-prometheus, "
                "s1-prometheus, ... in the ScaledObject's order (kubectl get scaledobject "
                "<fullname>-server -o jsonpath='{.spec.triggers[*].name}'): sessions, "
                "rounds-in-flight, listen-streams, tasks-running, tasks-queued, "
                "initialize-refused, less those set to 0; cpu is the CPU trigger. From "
                "kube-state-metrics.",
                "percentunit",
                (Query(HPA_RATIO, "{{horizontalpodautoscaler}} {{metric_name}}"),),
            ),
            PanelSpec(
                "Trigger targets (HPA)",
                "Each HPA metric's target: average (per replica, AverageValue), value "
                "(fleet-wide, Value) or utilization (CPU %). The per-replica signals below "
                "are measured against these. From kube-state-metrics.",
                "short",
                (
                    Query(
                        HPA_TARGETS,
                        "{{horizontalpodautoscaler}} {{metric_name}} {{metric_target_type}}",
                        table=True,
                    ),
                ),
                kind="table",
            ),
            PanelSpec(
                "Server signals per replica",
                "The ScaledObject's per-replica signals: live handshake sessions "
                "(target sessionCapFraction x router.sessionCap), requests in flight "
                "(roundsInFlight) and listen streams (listenStreamsFraction x "
                "server.listenStreams), each summed over the replicas and divided by them.",
                "short",
                (
                    Query(_per_replica("sum", "mcpfleet_replica_sessions"), "{{job}} sessions"),
                    Query(
                        _per_replica("sum", "mcpfleet_replica_requests_in_flight"),
                        "{{job}} rounds in flight",
                    ),
                    Query(_per_replica("sum", "mcpfleet_listen_streams"), "{{job}} listen streams"),
                ),
            ),
            PanelSpec(
                "Task signals per replica",
                "Task executions the workers run (target tasksRunningFraction x "
                "server.tasks.concurrency) and tasks waiting in the fleet's queue (its depth, "
                "the highest reading; target tasksQueuedPerReplica), each per replica. Only "
                "apps with task tools have them.",
                "short",
                (
                    Query(_per_replica("sum", "mcpfleet_tasks_running"), "{{job}} tasks running"),
                    Query(
                        _per_replica("max", "mcpfleet_tasks_queue_depth"), "{{job}} tasks queued"
                    ),
                ),
            ),
            PanelSpec(
                "initialize refused for capacity",
                "New handshake sessions the routers refused because every replica is at its "
                "session cap, per second, fleet-wide (a Value trigger: target "
                "refusedInitializePerSecond). 0 while none is refused.",
                "reqps",
                (
                    Query(
                        "sum by (namespace) (rate(mcpfleet_router_requests_total"
                        f'{{{NS},route="initialize",outcome="no_replica"}}[{RATE}])) '
                        "or sum by (namespace) (0 * rate(mcpfleet_router_requests_total"
                        f'{{{NS},route="initialize"}}[{RATE}]))',
                        "{{namespace}}",
                    ),
                ),
            ),
            PanelSpec(
                "Router requests in flight per router",
                "Requests each router handles now, open streams included, averaged over "
                "the routers (target router.autoscaling.mcp.requestsInFlight).",
                "short",
                (
                    Query(
                        "sum by (namespace, job) (mcpfleet_router_requests_in_flight"
                        f"{{{NS}}}) / count by (namespace, job) "
                        f"(mcpfleet_router_requests_in_flight{{{NS}}})",
                        "{{job}}",
                    ),
                ),
            ),
        ],
    )


# --- mcpfleet / Routing ------------------------------------------------------------------


def routing_dashboard() -> dict[str, Any]:
    return build(
        "mcpfleet-routing",
        "mcpfleet / Routing",
        "The sticky router and the replicas behind it: sessions, traffic kinds, owner-gone "
        "404s, resends, Redis health, proxy latency, and the autoscaler against its targets.",
        [
            (
                "Sessions and replicas",
                [
                    PanelSpec(
                        "Sessions per replica",
                        "Live handshake-era sessions each replica owns, as the replicas report "
                        "them.",
                        "short",
                        (Query(f"sum by (pod) (mcpfleet_replica_sessions{{{NS}}})", "{{pod}}"),),
                    ),
                    PanelSpec(
                        "Replicas by state (router's view)",
                        "Replicas the routers know, serving or draining.",
                        "short",
                        (Query(f"max by (state) (mcpfleet_router_replicas{{{NS}}})", "{{state}}"),),
                    ),
                    PanelSpec(
                        "Requests in flight per replica",
                        "Requests each replica is serving now (listening streams excluded).",
                        "short",
                        (
                            Query(
                                f"sum by (pod) (mcpfleet_replica_requests_in_flight{{{NS}}})",
                                "{{pod}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Draining replicas",
                        "Replicas draining after SIGTERM: they finish their sessions and take "
                        "no new work.",
                        "short",
                        (Query(f"sum(mcpfleet_replica_draining{{{NS}}})"),),
                        kind="stat",
                    ),
                ],
            ),
            (
                "Traffic",
                [
                    PanelSpec(
                        "Requests by route",
                        "Requests per second: sticky (handshake-era session, to its owner), "
                        "initialize (new session, placed by load), stateless (modern era, any "
                        "replica).",
                        "reqps",
                        (Query(_rate("mcpfleet_router_requests_total", "route"), "{{route}}"),),
                    ),
                    PanelSpec(
                        "Requests by outcome",
                        "Requests per second by how they ended at the router.",
                        "reqps",
                        (
                            Query(
                                _rate("mcpfleet_router_requests_total", "route, outcome"),
                                "{{route}} {{outcome}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Owner-gone 404s",
                        "Sessions answered 404 because their owner left (the client "
                        "re-initializes), by how the router noticed.",
                        "reqps",
                        (Query(_rate("mcpfleet_router_owner_gone_total", "reason"), "{{reason}}"),),
                    ),
                    PanelSpec(
                        "Resends",
                        "Requests resent to another replica because none processed them "
                        "(refused connection, a draining replica).",
                        "reqps",
                        (Query(_rate("mcpfleet_router_resends_total", "reason"), "{{reason}}"),),
                    ),
                    PanelSpec(
                        "Session lookups by source",
                        "Where the router found a session's owner: its cache, Redis, or not at "
                        "all.",
                        "ops",
                        (
                            Query(
                                _rate("mcpfleet_router_session_lookups_total", "source"),
                                "{{source}}",
                            ),
                        ),
                    ),
                    PanelSpec(
                        "Redis degraded",
                        "1 while a router cannot reach Redis and routes from its caches.",
                        "none",
                        (Query(f"max by (pod) (mcpfleet_router_degraded{{{NS}}})", "{{pod}}"),),
                    ),
                ],
            ),
            (
                "Latency",
                [
                    PanelSpec(
                        "Proxy latency by route",
                        "Time from a request's arrival at the router to the upstream response "
                        "headers, p50 and p99. With tracing on, the points are exemplars: one "
                        "traced request each, linked to its trace in the Traces data source.",
                        "s",
                        tuple(
                            Query(
                                _quantile(q, "mcpfleet_router_proxy_seconds", "route"),
                                _pct(q) + " {{route}}",
                            )
                            for q in (0.5, 0.99)
                        ),
                        width=24,
                        traces=True,
                    ),
                ],
            ),
            autoscaling_row(),
        ],
    )


DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "mcpfleet-rounds.json": rounds_dashboard,
    "mcpfleet-keyring.json": keyring_dashboard,
    "mcpfleet-routing.json": routing_dashboard,
}


def render(build_fn: Callable[[], dict[str, Any]]) -> str:
    """The committed form: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(build_fn(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name, fn in DASHBOARDS.items():
        path = args.out / name
        text = render(fn)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print("out of date (run make dashboards): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
