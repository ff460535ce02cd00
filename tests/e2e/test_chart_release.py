"""One release of the chart, for real: install, helm test, upgrade, rotate, drain, uninstall.

The tests run in order on one release (one install per module: a node and an
install cost about a minute). Traffic comes from this machine through the
router Service, as any client's would. Each scenario is the shared one of
``fleetkit.scenarios``, run here on :class:`~fleetkit.cluster.chartfleet.ChartFleet`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit import scenarios
from fleetkit.clients.listen import listening
from fleetkit.clients.rawsession import bounded, open_sessions
from fleetkit.clients.wire import initialize_body, modern_call
from fleetkit.cluster.chartfleet import GROUP, VERSION, ChartFleet, ready
from fleetkit.cluster.controlplane import wait_for
from fleetkit.cluster.providers import Cluster
from mcpfleet.contract import KEYRING_NUDGE_ANNOTATION
from mcpfleet.fleetclient import Trace, connect
from mcpfleet_examples.app import WEEKLY_REPORT

pytestmark = pytest.mark.timeout(900)

NAMESPACE = "mcpfleet-e2e"
#: The upgrade shortens the token TTL (a change of the pod template, so the
#: replicas roll), and the rotation after it then waits 5 s rather than 10 min.
SHORT_TTL = 5


@pytest.fixture(scope="module")
def release(e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartFleet]:
    fleet = ChartFleet(e2e_cluster, NAMESPACE, tmp_path_factory.mktemp("release"))
    yield fleet
    # Gone already when the last test passed; the node goes with its module anyway.
    with contextlib.suppress(Exception):
        fleet.uninstall()


def _rolled(release: ChartFleet, component: str, replicas: int, flag: str | None = None) -> None:
    """Until ``component`` runs exactly ``replicas`` ready pods, none terminating (each
    with ``flag`` in its args when given): helm's --wait returns once enough new pods
    are ready, while old ones may still take sessions and drain them for 30 s."""

    def settled() -> bool:
        pods = release.pods(component)
        return len(pods) == replicas and all(
            ready(p) and (flag is None or flag in (p.spec.containers[0].args or [])) for p in pods
        )

    wait_for(settled, timeout=300, interval=1, what=f"{replicas} settled {component} pod(s)")


def test_install_with_default_values_makes_every_pod_ready(release: ChartFleet) -> None:
    release.install()
    pods = release.core.list_namespaced_pod(NAMESPACE).items
    components = {p.metadata.labels["app.kubernetes.io/component"] for p in pods}
    assert components == {"server", "router", "redis", "operator"}
    assert len(release.pods("server")) == 3 and len(release.pods("router")) == 2
    for pod in pods:
        assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions), (
            pod.metadata.name
        )
        for status in pod.status.container_statuses:
            assert status.restart_count == 0, (pod.metadata.name, status.restart_count)
    serving = release.wait_serving(3, timeout=120)
    ring = release.ring()

    def keyring_ready() -> bool:
        status = release.custom.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "keyrings", release.keyring
        ).get("status", {})
        return status.get("phase") == "Ready" and status.get("sealingKid") == ring.kids[0]

    wait_for(keyring_ready, timeout=120, what="the KeyRing Ready on the Secret's ring")
    attested = release.attestations()
    assert all(attested[n].kids == ring.kids for n in serving)


def test_helm_test_runs_both_eras_through_the_router_service(release: ChartFleet) -> None:
    # The Pod runs `mcpfleet selftest` (exit 0 only when both eras initialized
    # and listed the tools through the router, tests/fleet/test_selftest.py)
    # and is deleted once it passed.
    out = release.test()
    assert re.search(r"TEST SUITE:\s+mcpfleet-selftest", out), out
    assert re.search(r"Phase:\s+Succeeded", out), out
    assert not [
        p
        for p in release.core.list_namespaced_pod(NAMESPACE).items
        if p.metadata.name == "mcpfleet-selftest"
    ]


async def test_the_router_service_answers_both_eras_from_this_machine(release: ChartFleet) -> None:
    await scenarios.modern_rounds_spread(release)
    await scenarios.handshake_session_sticks(release)
    ready = httpx.get(release.url.replace("/mcp", "/readyz"), timeout=10)
    assert ready.status_code == 200
    # A Host that is not the router's is refused (DNS rebinding).
    refused = httpx.post(
        release.url, headers={"host": "attacker.example"}, content=b"{}", timeout=10
    )
    assert refused.status_code in (403, 421), refused.status_code


async def test_a_listen_stream_through_the_router_hears_a_change_made_on_another_replica(
    release: ChartFleet,
) -> None:
    """Listen streams opened through the router Service until they sit on two replicas,
    each subscribed to the example app's ``report://weekly``; a task created through the
    router: every stream gets one ``resources/updated``, so at least one got it from a
    replica other than the one whose tool call published it."""
    timeout = httpx.Timeout(10, read=None)
    async with httpx.AsyncClient(timeout=timeout) as http, contextlib.AsyncExitStack() as stack:
        streams = []
        for i in range(12):
            listener = await stack.enter_async_context(
                listening(http, release.url, 100 + i, resourceSubscriptions=[WEEKLY_REPORT])
            )
            ack = await listener.next_event(30)
            assert ack.method == "notifications/subscriptions/acknowledged", ack.message
            streams.append(listener)
            if i >= 3 and len({s.replica for s in streams}) >= 2:
                break
        replicas = {s.replica for s in streams}
        assert len(replicas) >= 2 and None not in replicas, replicas
        async with connect(release.url, "modern") as client:
            result = await client.call_tool("create_task", {"project": "e2e"})
        assert str(result.data).startswith("Created"), result.data
        for listener in streams:
            frame = await listener.next_event(30)
            assert frame.method == "notifications/resources/updated", frame.message
            assert frame.message is not None
            assert frame.message["params"]["uri"] == WEEKLY_REPORT


async def test_helm_upgrade_rolls_the_replicas_with_no_failed_round(release: ChartFleet) -> None:
    def roll() -> None:
        release.upgrade("--set", f"server.stateTTL={SHORT_TTL}")

    new = await scenarios.rolling_update_under_load(release, roll)
    for pod in release.pods("server"):
        if pod.metadata.name in new:
            assert f"--state-ttl={SHORT_TTL}" in pod.spec.containers[0].args
    assert len(new) == 3


# A router going away cuts the connections of the MCP client (a third-party one) now
# and then, and the client drops such a connection without closing it: that
# ResourceWarning is the client's, not the fleet's (as in test_router_resilience).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_helm_upgrade_rolls_the_routers_and_loses_no_round_and_no_session(
    release: ChartFleet,
) -> None:
    """The routers roll (a changed pod template) under modern and handshake traffic: no
    modern round fails, and every handshake session opened before answers after it
    (a held SSE stream may be cut by its router's shutdown; the session must not be).
    The modern users keep their connections alive: a router going away closes each
    after an answer (router.drainLinger), never under a request just sent."""
    # The sessions held here must not open on a replica of the last roll that is
    # about to drain (its drain deadline would end them).
    await asyncio.to_thread(_rolled, release, "server", 3)
    old = {p.metadata.name for p in release.pods("router")}
    stop = asyncio.Event()
    done: list[str] = []
    failed: list[str] = []

    async def modern_user() -> None:
        while not stop.is_set():
            try:
                async with connect(release.url, "modern") as client:
                    while not stop.is_set():
                        result = await client.call_tool("book_flight", {"destination": "Oslo"})
                        assert str(result.data).startswith("Booked"), result.data
                        done.append("modern")
            except Exception as exc:
                failed.append(f"modern {type(exc).__name__}: {exc}")

    async with contextlib.AsyncExitStack() as stack:
        traces = [Trace() for _ in range(4)]
        held = [
            await stack.enter_async_context(connect(release.url, "handshake", trace))
            for trace in traces
        ]
        for n, client in enumerate(held):
            result = await client.call_tool("plan_meeting", {"topic": f"before {n}"})
            assert str(result.data).startswith(f"Planned 'before {n}'")
        sessions = [{r.session for r in t.rounds if r.session} for t in traces]
        assert all(len(s) == 1 for s in sessions), sessions
        users = [asyncio.create_task(modern_user()) for _ in range(2)]
        try:
            await asyncio.to_thread(
                wait_for, lambda: len(done) >= 5, timeout=60, what="traffic before the roll"
            )
            await asyncio.to_thread(
                release.upgrade, "--set-string", "router.podAnnotations.mcpfleet\\.dev/rolled=1"
            )

            def old_routers_gone() -> bool:
                return not old & {p.metadata.name for p in release.pods("router")}

            await asyncio.to_thread(
                wait_for, old_routers_gone, timeout=120, interval=1, what="the old routers gone"
            )
            before = len(done)
            await asyncio.to_thread(
                wait_for, lambda: len(done) >= before + 5, timeout=60, what="traffic after it"
            )
        finally:
            stop.set()
            await asyncio.gather(*users)
        assert failed == [], failed[:5]
        for n, (client, trace) in enumerate(zip(held, traces, strict=True)):
            result = await client.call_tool("plan_meeting", {"topic": f"after {n}"})
            assert str(result.data).startswith(f"Planned 'after {n}'"), result.data
            assert {r.session for r in trace.rounds if r.session} == sessions[n], (
                "the same session answered"
            )
    routers = release.pods("router")
    assert len(routers) == 2 and not {p.metadata.name for p in routers} & old
    for pod in routers:
        assert pod.metadata.annotations["mcpfleet.dev/rolled"] == "1"


async def test_a_keyrotation_created_with_kubectl_fails_no_round(release: ChartFleet) -> None:
    before = release.ring().kids
    kids = await scenarios.operator_rotation_under_load(release, release.rotate)
    assert kids[0] not in before
    # The operator nudged every replica pod after its last Secret write: the
    # annotation names the resourceVersion of the Secret as it stands now.
    secret = release.core.read_namespaced_secret(release.keyring, NAMESPACE)
    version = secret.metadata.resource_version
    for pod in release.pods():
        if pod.metadata.deletion_timestamp is None:
            assert (pod.metadata.annotations or {}).get(KEYRING_NUDGE_ANNOTATION) == version


def _nudge_servers(release: ChartFleet) -> None:
    """Annotate the replica pods: the kubelet syncs their volumes (the limits ConfigMap)
    now rather than at its next periodic sync (docs/limits.md)."""
    release.kubectl(
        "annotate",
        "pods",
        "-l",
        release.selector("server"),
        f"mcpfleet.dev/limits-nudge={time.time_ns()}",
        "--overwrite",
    )


def _limits_reads(release: ChartFleet) -> dict[str, int]:
    """How many times each ready replica logged putting a limits file in force."""
    return {
        pod.metadata.name: release.kubectl("logs", pod.metadata.name).count("read; in force now")
        for pod in release.pods("server")
        if ready(pod)
    }


def _limits_changed(release: ChartFleet, *args: str) -> None:
    """``helm upgrade`` with ``args``, the pods nudged, until every replica read the change."""
    before = _limits_reads(release)
    release.upgrade(*args)
    _nudge_servers(release)
    wait_for(
        lambda: all(n > before.get(p, 0) for p, n in _limits_reads(release).items()),
        timeout=180,
        interval=2,
        what="every replica to read the new limits",
    )


def _initialize(http: httpx.Client, url: str) -> httpx.Response:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    return http.post(url, content=initialize_body("e2e-limits"), headers=headers)


def test_limits_set_through_chart_values_apply_without_a_restart(release: ChartFleet) -> None:
    """``helm upgrade --set server.limits.sessions=2``: the ConfigMap changes, no replica
    restarts, the replicas read it, and this machine's third session is refused with the
    429; the refusal is in the series the Limits row of the Rounds dashboard reads."""
    before = {p.metadata.uid for p in release.pods("server") if ready(p)}
    _limits_changed(release, "--set", "server.limits.sessions=2")
    opened: list[str] = []
    refused: list[httpx.Response] = []
    with httpx.Client(timeout=10) as http:

        def limited() -> bool:
            resp = _initialize(http, release.url)
            if resp.status_code == 200:
                opened.append(resp.headers["mcp-session-id"])
                return False
            refused.append(resp)
            return resp.status_code == 429

        try:
            wait_for(limited, timeout=60, interval=1, what="the new session limit in force")
        finally:
            for session in opened:
                http.delete(release.url, headers={"mcp-session-id": session})
    assert refused[-1].json()["error"]["data"]["limit"] == "sessions"
    assert int(refused[-1].headers["retry-after"]) >= 1
    assert {p.metadata.uid for p in release.pods("server") if ready(p)} == before, "no restart"
    texts = [
        release.core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod.metadata.name}:8001", NAMESPACE, "metrics"
        )
        for pod in release.pods("server")
        if ready(pod)
    ]
    assert any('mcpfleet_limited_total{limit="sessions"' in t for t in texts), texts
    for metric in ("mcpfleet_limit_principals_limited", "mcpfleet_limit_checks_failed_total"):
        assert all(metric in t for t in texts), metric
    # Lifted on every replica before the next test opens sessions.
    _limits_changed(release, "--set", "server.limits.sessions=0")
    with httpx.Client(timeout=10) as http:

        def open_again() -> bool:
            resp = _initialize(http, release.url)
            if resp.status_code == 200:
                http.delete(release.url, headers={"mcp-session-id": resp.headers["mcp-session-id"]})
            return resp.status_code == 200

        wait_for(open_again, timeout=180, interval=1, what="the limit lifted")


#: An OTLP/HTTP trace receiver run in the cluster on the release's own image (which
#: carries ``opentelemetry-proto``): one JSON line per span it is sent, on stdout.
RECEIVER = """
import gzip, json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            res = {a.key: a.value.string_value for a in rs.resource.attributes}
            for scope in rs.scope_spans:
                for span in scope.spans:
                    line = {"service": res.get("service.name"), "pod": res.get("k8s.pod.name"),
                            "name": span.name, "trace": span.trace_id.hex(),
                            "span": span.span_id.hex(), "parent": span.parent_span_id.hex()}
                    print(json.dumps(line), flush=True)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("", 4318), Handler).serve_forever()
"""


def _otlp_receiver(release: ChartFleet) -> str:
    """The receiver's Pod and Service in the release's namespace: its endpoint."""
    image = release.pods("server")[0].spec.containers[0]
    labels = {"app.kubernetes.io/name": "otlp-receiver"}
    restricted = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "otlp-receiver", "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "receiver",
                    "image": image.image,
                    "imagePullPolicy": image.image_pull_policy,
                    "command": ["python", "-c", RECEIVER],
                    "ports": [{"containerPort": 4318}],
                    "securityContext": restricted,
                }
            ]
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "otlp-receiver"},
        "spec": {"selector": labels, "ports": [{"port": 4318, "targetPort": 4318}]},
    }
    release.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod, service]}),
    )
    release.kubectl("wait", "--for=condition=Ready", "pod/otlp-receiver", "--timeout=120s")
    return f"http://otlp-receiver.{NAMESPACE}.svc:4318"


def _received(release: ChartFleet, trace_id: str) -> list[dict[str, str]]:
    lines = release.kubectl("logs", "otlp-receiver").splitlines()
    spans = [json.loads(line) for line in lines if line.startswith("{")]
    return [s for s in spans if s["trace"] == trace_id]


def test_with_tracing_values_one_requests_trace_arrives_whole_from_router_and_replica(
    release: ChartFleet,
) -> None:
    """``helm upgrade --set tracing.otlpEndpoint=...`` pointing at a receiver in the
    cluster: a modern round sent through the router Service with a client's
    traceparent arrives as one trace, the router's server span under the client's span
    and the replica's under the router's, each from its own pod."""
    endpoint = _otlp_receiver(release)
    counts = {c: sum(ready(p) for p in release.pods(c)) for c in ("server", "router")}
    try:
        release.upgrade("--set", f"tracing.otlpEndpoint={endpoint}")
        for component, replicas in counts.items():
            _rolled(release, component, replicas)
        trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
        header = {"traceparent": f"00-{trace_id}-{client_span}-01"}
        first = modern_call(release.url, "book_flight", {"destination": "Oslo"}, headers=header)
        assert first.result.get("resultType") == "input_required", first.body

        def whole() -> list[dict[str, str]] | None:
            spans = _received(release, trace_id)
            router = [
                s for s in spans if s["service"] == "mcpfleet-router" and s["parent"] == client_span
            ]
            replica = [
                s
                for s in spans
                if s["service"] == "mcpfleet-replica"
                and router
                and s["parent"] == router[0]["span"]
            ]
            tool = [
                s
                for s in spans
                if replica and s["parent"] == replica[0]["span"] and "book_flight" in s["name"]
            ]
            return spans if len(router) == 1 and len(replica) == 1 and len(tool) == 1 else None

        spans = wait_for(whole, timeout=60, interval=2, what="the round's trace at the receiver")
        pods = {s["service"]: s["pod"] for s in spans if s["service"]}
        assert pods["mcpfleet-router"] in {p.metadata.name for p in release.pods("router")}
        assert pods["mcpfleet-replica"] in {p.metadata.name for p in release.pods("server")}
    finally:
        release.upgrade("--set", "tracing.otlpEndpoint=")
        release.kubectl("delete", "pod/otlp-receiver", "service/otlp-receiver", "--wait=false")


async def test_deleting_a_replica_pod_drains_it_and_nothing_fails(release: ChartFleet) -> None:
    victim = release.replica_names()[1]
    await scenarios.drain_under_load(release, victim, gone=lambda n: not release.pod_exists(n))
    serving = await asyncio.to_thread(release.wait_serving, 3, 300)
    assert victim not in serving


async def _idle_sessions_through_a_replica_roll(
    release: ChartFleet, count: int, mark: str
) -> tuple[Counter[int], int, float]:
    """``count`` idle sessions of a client that never re-initializes, a ``helm
    upgrade`` that rolls the replicas (a pod annotation), one request on each:
    (statuses, answers on the session's own id, seconds until the old pods were gone)."""
    await asyncio.to_thread(_rolled, release, "server", 3)
    old = {p.metadata.name for p in release.pods("server")}
    async with httpx.AsyncClient(timeout=60) as http:
        sessions = await open_sessions(release.url, http, count)
        started = time.monotonic()
        await asyncio.to_thread(
            release.upgrade, "--set-string", f"server.podAnnotations.mcpfleet\\.dev/rolled={mark}"
        )
        await asyncio.to_thread(
            wait_for,
            lambda: not old & {p.metadata.name for p in release.pods("server")},
            timeout=300,
            interval=1,
            what="the old replicas gone",
        )
        took = time.monotonic() - started
        answers = await bounded(sessions, lambda s: s.ping())
    same_id = sum(
        1
        for s, a in zip(sessions, answers, strict=True)
        if a.status_code == 200 and a.headers.get("mcp-session-id", s.session) == s.session
    )
    return Counter(a.status_code for a in answers), same_id, took


async def test_helm_upgrade_under_idle_sessions_of_a_client_that_never_reinitializes(
    release: ChartFleet,
) -> None:
    """50 idle handshake sessions through a rolling upgrade of the replicas, with
    router.rehomeSessions off (each gets the spec's 404; each old replica waits out
    its drain timeout for its idle sessions), then on (docs/rehome.md): 0
    client-visible errors, the idle sessions handed over at once. It runs after the
    other scenarios of the release: it leaves the mode on, under which an idle session
    of a draining replica moves (the drain scenario counts one owner per session)."""
    count = 50
    off, _, off_took = await _idle_sessions_through_a_replica_roll(release, count, "off")
    # The mode on: the routers keep what re-opens a session; replicas hand over.
    await asyncio.to_thread(release.upgrade, "--set", "router.rehomeSessions=true")
    await asyncio.to_thread(_rolled, release, "router", 2, "--rehome-sessions")
    await asyncio.to_thread(_rolled, release, "server", 3, "--drain-handover")
    release.wait_serving(3, timeout=300)
    on, on_kept, on_took = await _idle_sessions_through_a_replica_roll(release, count, "on")
    print(
        f"\n{count} idle sessions through helm upgrade of 3 replicas:"
        f"\n  router.rehomeSessions=false: statuses {dict(off)},"
        f" old replicas gone in {off_took:.0f} s"
        f"\n  router.rehomeSessions=true : {on_kept}/{count} on their old id, statuses {dict(on)},"
        f" old replicas gone in {on_took:.0f} s"
    )
    assert off == {404: count}
    assert on_kept == count, on


def test_helm_uninstall_leaves_only_what_is_documented(release: ChartFleet) -> None:
    release.uninstall()
    core, apps = release.core, k8s.AppsV1Api(release.cluster.api)

    def gone() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE).items
        return not pods

    wait_for(gone, timeout=180, interval=1, what="every pod of the release gone")
    assert apps.list_namespaced_deployment(NAMESPACE).items == []
    services = [s.metadata.name for s in core.list_namespaced_service(NAMESPACE).items]
    assert services == []
    assert (
        core.list_namespaced_config_map(
            NAMESPACE, label_selector="app.kubernetes.io/instance=mcpfleet"
        ).items
        == []
    )
    assert (
        release.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "keyrings")["items"]
        == []
    )
    # What stays, as the chart's README says: the CRDs and the key Secret.
    ext = k8s.ApiextensionsV1Api(release.cluster.api)
    for crd in ("keyrings.mcpfleet.dev", "keyrotations.mcpfleet.dev"):
        ext.read_custom_resource_definition(crd)
    secrets = {s.metadata.name for s in core.list_namespaced_secret(NAMESPACE).items}
    assert release.keyring in secrets
    leftovers = secrets - {release.keyring}
    assert not [s for s in leftovers if s.startswith("sh.helm.release")], leftovers
    with pytest.raises(ApiException):
        k8s.RbacAuthorizationV1Api(release.cluster.api).read_namespaced_role(
            "mcpfleet-operator", NAMESPACE
        )


def test_a_reinstall_adopts_the_kept_secret_and_keep_secret_false_deletes_it(
    release: ChartFleet,
) -> None:
    kept = release.ring()  # left by the uninstall before, as documented
    release.install(
        "--set",
        "keyRing.keepSecret=false",
        "--set",
        "server.replicas=1",
        "--set",
        "router.replicas=1",
    )
    # The operator adopted the kept ring: the replica serves with the same keys.
    release.wait_attested(kept.kids, timeout=120)
    assert release.ring().kids == kept.kids
    release.uninstall()

    def secret_gone() -> bool:
        names = {s.metadata.name for s in release.core.list_namespaced_secret(NAMESPACE).items}
        return release.keyring not in names

    wait_for(secret_gone, timeout=60, interval=1, what="the key Secret deleted by the hook")
    assert (
        release.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "keyrings")["items"]
        == []
    )
