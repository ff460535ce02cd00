"""``mcpfleet operator`` and ``mcpfleet rotate``: run the operator, request and follow rotations.

``server/mcpfleet/cli.py`` owns the ``mcpfleet`` command and delegates these two
subcommands here (:func:`add_parsers`, :func:`run`). kopf and the Kubernetes
client are imported only when one of them runs, so the replica and the router
start without them.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import random
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcpfleet_operator.api import GROUP, KEYRINGS, KEYROTATIONS, VERSION, rotation_manifest
from mcpfleet_operator.deletioncost import PatchPolicy
from mcpfleet_operator.rotation import TASKS_WAIT_LIMIT

if TYPE_CHECKING:
    from mcpfleet.redisconn import RedisSettings

log = logging.getLogger("mcpfleet_operator")

#: Exit statuses of ``mcpfleet rotate --wait``.
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_parsers(sub: Any) -> None:
    """Add the ``operator`` and ``rotate`` subcommands to ``mcpfleet``'s parser."""
    o = sub.add_parser("operator", help="run the key ring operator (kopf)")
    where = o.add_mutually_exclusive_group()
    where.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeat for more; default: $POD_NAMESPACE)",
    )
    where.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    from mcpfleet.commands import redisflags

    redisflags.add_flags(
        o,
        url_help="Redis to read attestations from (a read-only account is enough)",
        default="",
        env_note=" (default: $MCPFLEET_REDIS_URL)",
    )
    o.add_argument("--metrics-host", default="0.0.0.0", help="address /metrics listens on")
    o.add_argument("--metrics-port", type=int, default=9090, help="port /metrics listens on")
    o.add_argument("--health-host", default="0.0.0.0", help="address the liveness check listens on")
    o.add_argument("--health-port", type=int, default=8080, help="kopf's liveness: GET /healthz")
    o.add_argument(
        "--peering",
        default="mcpfleet",
        help="KopfPeering object the operator replicas share (only one acts)",
    )
    o.add_argument("--standalone", action="store_true", help="no peering: act alone")
    o.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; the highest alive acts (default: random, so two never tie)",
    )
    o.add_argument(
        "--peering-lifetime",
        type=int,
        default=60,
        help="seconds after its last keep-alive that a silent operator is presumed dead",
    )
    o.add_argument(
        "--stall-after",
        type=float,
        default=120.0,
        help="seconds a rotation step may wait for replicas before it is reported stalled",
    )
    o.add_argument(
        "--tasks-wait-limit",
        type=float,
        default=TASKS_WAIT_LIMIT,
        help="seconds after the token TTL a rotation waits for live MCP tasks sealed under "
        "the old key before it retires the key anyway (those tasks fail)",
    )
    _add_cost_flags(o)
    o.add_argument(
        "--log-format", choices=["plain", "json"], default="plain", help="how log lines look"
    )

    r = sub.add_parser("rotate", help="rotate a KeyRing's key (creates a KeyRotation)")
    r.add_argument("keyring", help="the KeyRing's name")
    r.add_argument("-n", "--namespace", default=None, help="default: the kubeconfig's namespace")
    r.add_argument("--emergency", action="store_true", help="skip the token TTL wait")
    r.add_argument("--reason", default="", help="why (kept in the KeyRotation and its Events)")
    r.add_argument("--wait", action="store_true", help="follow the rotation until it ends")
    r.add_argument("--timeout", type=float, default=None, help="give up waiting after SECONDS")
    r.add_argument("--status", action="store_true", help="print the ring and its history")


def _add_cost_flags(o: Any) -> None:
    """The replica Pods' deletion cost (docs/autoscaling.md): on, and how often it is written."""
    policy = PatchPolicy()
    o.add_argument(
        "--deletion-cost",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep controller.kubernetes.io/pod-deletion-cost on each replica Pod current "
        "from what it holds, so a scale-in removes the emptiest replica (default: on)",
    )
    o.add_argument(
        "--deletion-cost-step",
        type=int,
        default=policy.min_step,
        help="least change of a Pod's cost (and at least 10%% of it) written at once",
    )
    o.add_argument(
        "--deletion-cost-max-interval",
        type=float,
        default=policy.max_interval,
        help="seconds after a Pod's last write that a smaller change is written too",
    )
    o.add_argument(
        "--deletion-cost-rate",
        type=float,
        default=policy.per_second,
        help="at most this many deletion cost writes a second, all Pods together",
    )


#: The ``mcpfleet`` subcommands this module adds (entry point ``mcpfleet.commands``).
COMMANDS = ("operator", "rotate")


def run(args: argparse.Namespace) -> int:
    missing = [m for m in ("kopf", "kubernetes") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"mcpfleet {args.command}: needs {' and '.join(missing)}, from the operator extra: "
            "pip install 'mcpfleet[operator]'",
            file=sys.stderr,
        )
        return 2
    if args.command == "operator":
        return run_operator(args)
    return run_rotate(args)


# --------------------------------------------------------------------------- clients


def api_client() -> Any:
    """A Kubernetes API client: in-cluster in a Pod, else from $KUBECONFIG."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    configuration = k8s.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration, persist_config=False
        )
    # kopf's thread pool calls the API from many threads at once.
    configuration.connection_pool_maxsize = 32
    return k8s.ApiClient(configuration)


def default_namespace() -> str:
    from kubernetes import config as k8s_config

    try:
        _, active = k8s_config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        return str(active["context"].get("namespace") or "default")
    except Exception:
        return os.environ.get("POD_NAMESPACE", "default")


# --------------------------------------------------------------------------- operator


class _UsageError(Exception):
    """A flag or the environment that stops ``mcpfleet operator`` before it starts."""


def run_operator(args: argparse.Namespace) -> int:
    import kopf

    from mcpfleet_operator import handlers  # noqa: F401  (importing registers them with kopf)
    from mcpfleet_operator.costkeeper import CostKeeper
    from mcpfleet_operator.runtime import Runtime

    try:
        policy = cost_policy(args)
        redis_settings = _redis_settings(args)
        namespaces = _namespaces(args)
        if args.log_format == "json":
            logging.getLogger().handlers.clear()
            kopf.configure(log_format=kopf.LogFormat.JSON)
        api = api_client()
        _check_peering(api, args, namespaces)
    except _UsageError as exc:
        print(f"mcpfleet operator: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runtime = Runtime(
        api=api,
        redis_settings=redis_settings,
        stall_after=args.stall_after,
        tasks_wait_limit=args.tasks_wait_limit,
    )
    if args.deletion_cost:
        runtime.costs = CostKeeper(runtime.metrics, policy)
    runtime.metrics.serve(args.metrics_port, args.metrics_host)
    _run_kopf(args, namespaces, redis_settings.redacted, runtime)
    return 0


def cost_policy(args: argparse.Namespace) -> PatchPolicy:
    """How often deletion costs are written, from the flags (refused when out of range)."""
    try:
        return PatchPolicy(
            min_step=args.deletion_cost_step,
            max_interval=args.deletion_cost_max_interval,
            per_second=args.deletion_cost_rate,
        )
    except ValueError as exc:
        raise _UsageError(f"--deletion-cost-*: {exc}") from exc


def _redis_settings(args: argparse.Namespace) -> RedisSettings:
    """The Redis settings from ``--redis`` or ``$MCPFLEET_REDIS_URL`` (required)."""
    from mcpfleet import redisconn
    from mcpfleet.commands import redisflags

    source: redisconn.Source = "argument"
    if not args.redis:
        args.redis, source = os.environ.get("MCPFLEET_REDIS_URL", ""), "environment"
    if not args.redis:
        raise _UsageError("--redis (or $MCPFLEET_REDIS_URL) is required")
    try:
        return redisflags.from_args(args, source=source)
    except redisconn.RedisConfigError as exc:
        raise _UsageError(str(exc)) from exc


def _namespaces(args: argparse.Namespace) -> list[str]:
    """The namespaces to watch: the flags', else ``$POD_NAMESPACE`` (none for -A)."""
    namespaces = list(args.namespace)
    if not namespaces and not args.all_namespaces:
        if not os.environ.get("POD_NAMESPACE"):
            raise _UsageError("give --namespace NS or --all-namespaces")
        namespaces = [os.environ["POD_NAMESPACE"]]
    return namespaces


def _check_peering(api: Any, args: argparse.Namespace, namespaces: list[str]) -> None:
    """Refuse to start paused forever: the peering object must exist (unless standalone)."""
    if args.standalone:
        return
    missing = missing_peering(api, args.peering, None if args.all_namespaces else namespaces)
    if missing:
        raise _UsageError(
            f"no {missing} (the chart creates it); create it, or run with --standalone"
        )


def _run_kopf(args: argparse.Namespace, namespaces: list[str], redis: str, runtime: Any) -> None:
    """kopf's operator loop with the flags' settings, until it exits."""
    import kopf

    settings = kopf.OperatorSettings()
    settings.peering.lifetime = args.peering_lifetime
    priority = args.priority if args.priority is not None else random.randint(1, 2**31 - 1)
    log.info(
        "operator starting: %s, redis %s, peering %s (priority %d), metrics :%d, health :%d",
        "all namespaces" if args.all_namespaces else f"namespaces {', '.join(namespaces)}",
        redis,
        "off" if args.standalone else args.peering,
        priority,
        args.metrics_port,
        args.health_port,
    )
    kopf.run(
        settings=settings,
        clusterwide=args.all_namespaces,
        namespaces=namespaces,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=priority,
        liveness_endpoint=f"http://{args.health_host}:{args.health_port}/healthz",
        memo=runtime,
    )


def missing_peering(api: Any, name: str, namespaces: list[str] | None) -> str:
    """The peering object kopf would wait for forever, if it is missing ('' if all exist).

    With a peering name kopf starts paused until it sees its peers in that
    object; without the object it would stay paused, silently. A 403 (no
    right to look) is not a verdict: kopf will say more.
    """
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    custom = k8s.CustomObjectsApi(api)
    try:
        if namespaces is None:
            try:
                custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
            except ApiException as exc:
                if exc.status == 404:
                    return f"ClusterKopfPeering {name}"
                raise
            return ""
        for namespace in namespaces:
            try:
                custom.get_namespaced_custom_object(
                    "kopf.dev", "v1", namespace, "kopfpeerings", name
                )
            except ApiException as exc:
                if exc.status == 404:
                    return f"KopfPeering {name} in namespace {namespace}"
                raise
    except ApiException as exc:
        log.warning("cannot check the peering object %s: %s", name, exc.reason)
    return ""


# --------------------------------------------------------------------------- rotate


def run_rotate(args: argparse.Namespace) -> int:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    namespace = args.namespace or default_namespace()
    api = api_client()
    custom: Any = k8s.CustomObjectsApi(api)  # its methods return plain dicts
    try:
        keyring: dict[str, Any] = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, KEYRINGS, args.keyring
        )
    except ApiException as exc:
        if exc.status == 404:
            print(
                f"mcpfleet rotate: error: no KeyRing {args.keyring} in {namespace}", file=sys.stderr
            )
            return EXIT_USAGE
        raise
    if args.status:
        print_status(keyring, _history(custom, namespace, args.keyring))
        return 0
    body = rotation_manifest(
        args.keyring,
        generate_name=f"{args.keyring}-",
        mode="Emergency" if args.emergency else "Normal",
        reason=args.reason or "mcpfleet rotate",
    )
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, KEYROTATIONS, body
    )
    name = created["metadata"]["name"]
    print(f"keyrotation {namespace}/{name} created", flush=True)
    if not args.wait:
        return 0
    return follow(custom, namespace, name, args.timeout)


def follow(custom: Any, namespace: str, name: str, timeout: float | None) -> int:
    """Print each change of the rotation until it ends; 0 on Complete, else non-zero."""
    from kubernetes import watch as k8s_watch
    from kubernetes.client.exceptions import ApiException

    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    version = ""
    while deadline is None or time.monotonic() < deadline:
        stream = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        remaining = 30 if deadline is None else max(1, int(deadline - time.monotonic()))
        try:
            for event in stream.stream(  # type: ignore[no-untyped-call]
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                KEYROTATIONS,
                field_selector=f"metadata.name={name}",
                timeout_seconds=min(30, remaining),
                **({"resource_version": version} if version else {}),
            ):
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion", version)
                if event["type"] == "DELETED":
                    print(f"{name}: deleted (aborted)", flush=True)
                    return EXIT_FAILED
                line = progress_line(obj.get("status") or {})
                if line != last:
                    print(f"{name}: {line}", flush=True)
                    last = line
                phase = (obj.get("status") or {}).get("phase")
                if phase == "Complete":
                    return 0
                if phase in ("Failed", "Aborted"):
                    return EXIT_FAILED
        except ApiException as exc:
            if exc.status != 410:
                raise
            version = ""
        finally:
            stream.stop()  # type: ignore[no-untyped-call]
    print(f"{name}: still {last or 'pending'} after {timeout:g}s", file=sys.stderr)
    return EXIT_FAILED


def progress_line(status: Mapping[str, Any]) -> str:
    phase = status.get("phase") or "Pending"
    parts = [str(phase)]
    if status.get("convergence"):
        parts.append(f"converged {status['convergence']}")
    if status.get("newKid"):
        parts.append(f"new kid {status['newKid']}")
    lagging = status.get("lagging") or []
    if lagging:
        parts.append(f"lagging: {', '.join(lagging)}")
    if status.get("stalled"):
        parts.append("STALLED")
    if status.get("message"):
        parts.append(f"- {status['message']}")
    return " ".join(parts)


def _history(custom: Any, namespace: str, keyring: str) -> list[dict[str, Any]]:
    items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, KEYROTATIONS)["items"]
    mine = [i for i in items if (i.get("spec") or {}).get("keyRing") == keyring]
    return sorted(mine, key=lambda i: i["metadata"].get("creationTimestamp", ""))


def print_status(keyring: Mapping[str, Any], history: list[dict[str, Any]]) -> None:
    status = keyring.get("status") or {}
    replicas = status.get("replicas") or {}
    name = keyring["metadata"]["name"]
    print(f"keyring {keyring['metadata']['namespace']}/{name}: {status.get('phase', 'Unknown')}")
    kids = " ".join(status.get("kids") or [])
    print(f"  kids: {kids} (first seals; ring {status.get('ringPhase', '?')})")
    print(
        f"  replicas: {replicas.get('converged', 0)}/{replicas.get('desired', 0)} converged"
        + (f"; lagging: {', '.join(replicas['lagging'])}" if replicas.get("lagging") else "")
    )
    if status.get("message"):
        print(f"  {status['message']}")
    if status.get("nextRotationAt"):
        print(f"  next scheduled rotation: {status['nextRotationAt']}")
    print("history:" if history else "history: (no rotation yet)")
    for item in history:
        s = item.get("status") or {}
        spec = item.get("spec") or {}
        times = s.get("phaseTimestamps") or {}
        ended = next((times[p] for p in ("Complete", "Failed", "Aborted") if p in times), "")
        print(
            f"  {item['metadata']['name']}: {s.get('phase', 'Pending')}"
            f" {s.get('oldKid', '?')} -> {s.get('newKid', '?')} ({spec.get('mode', 'Normal')})"
            f" created {item['metadata'].get('creationTimestamp', '')}"
            + (f" ended {ended}" if ended else "")
            + (f" - {spec['reason']}" if spec.get("reason") else "")
        )
