"""The HPA's metrics adapter on a kind cluster: KEDA and the Prometheus its triggers read.

The autoscaling e2e tier (``tests/e2e/test_autoscaling.py``) installs both the way
docs/autoscaling.md tells a user to, from what this repository builds:

- KEDA, the version pinned in ``hack/tools/keda``: its own manifests (the
  ``config/minimal`` kustomization of its module: the CRDs, RBAC, the operator and
  the metrics API server with its APIService), with the image ``make
  autoscaling-images`` built from that source in place of KEDA's registry's;
- a Prometheus (Debian's) at ``prometheus-operated.monitoring.svc:9090``, the chart's
  default ``server.autoscaling.mcp.prometheusAddress``, scraping the replicas of a
  release as the chart's ServiceMonitor makes the Prometheus Operator do (job
  ``<fullname>-server``), every 2 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from fleetkit.cluster.chartkit import module_dir
from fleetkit.cluster.controlplane import repo_root, tools_bin_dir, wait_for
from fleetkit.cluster.pods import name_of
from fleetkit.cluster.providers import Cluster

KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA_NAMESPACE = "keda"
PROMETHEUS_NAMESPACE = "monitoring"
#: The chart's default server.autoscaling.mcp.prometheusAddress names this Service.
PROMETHEUS_SERVICE = "prometheus-operated"
SCRAPE_SECONDS = 2
#: The port a replica serves /metrics on (the chart's server.port).
SERVER_PORT = 8001


@dataclass(frozen=True)
class Images:
    """What ``make autoscaling-images`` (hack/image/autoscaling.sh) built."""

    keda: str
    keda_archive: Path
    prometheus: str
    prometheus_archive: Path


def images() -> Images:
    """The images, built (or found built) by hack/image/autoscaling.sh."""
    root = repo_root()
    done = subprocess.run(
        ["bash", str(root / "hack" / "image" / "autoscaling.sh")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"hack/image/autoscaling.sh exited {done.returncode}:\n{done.stderr}")
    keda_archive, prom_archive = (Path(line) for line in done.stdout.split()[-2:])
    return Images(
        keda=_image_of(keda_archive, "mcpfleet-keda-"),
        keda_archive=keda_archive,
        prometheus=_image_of(prom_archive, "mcpfleet-prometheus-"),
        prometheus_archive=prom_archive,
    )


def _image_of(archive: Path, prefix: str) -> str:
    """``.cache/image/mcpfleet-keda-v2.21.0.tar`` -> ``localhost/mcpfleet-keda:v2.21.0``."""
    name = archive.name.removesuffix(".tar")
    if not name.startswith(prefix):
        raise ValueError(f"{archive} is not an archive of {prefix}<tag>.tar")
    return f"localhost/{prefix[:-1]}:{name[len(prefix) :]}"


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(tools_bin_dir() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


# --------------------------------------------------------------------------- KEDA


def keda_manifests(image: str) -> list[dict[str, Any]]:
    """KEDA's own ``config/minimal`` for the pinned version, running ``image``."""
    source = module_dir(KEDA_MODULE, repo_root() / "hack" / "tools" / "keda") / "config" / "minimal"
    out = subprocess.run(
        [str(tools_bin_dir() / "kubectl"), "kustomize", str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            # ghcr.io/kedacore/keda:<v> and keda-metrics-apiserver:<v>: one image holds both.
            container["image"] = image
            container["imagePullPolicy"] = "Never"
    return docs


def install_keda(cluster: Cluster, built: Images) -> None:
    """KEDA on ``cluster``, until its metrics API answers the API server."""
    _load(cluster, [built.keda_archive])
    manifests = keda_manifests(built.keda)
    kubectl(
        cluster,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(manifests),
    )
    for name in ("keda-operator", "keda-metrics-apiserver"):
        kubectl(
            cluster,
            "-n",
            KEDA_NAMESPACE,
            "rollout",
            "status",
            f"deployment/{name}",
            "--timeout=300s",
            timeout=330,
        )

    def available() -> bool:
        doc = json.loads(
            kubectl(cluster, "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json")
        )
        conditions = doc.get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    wait_for(available, timeout=180, interval=2, what="KEDA's external metrics API available")


# --------------------------------------------------------------------------- Prometheus


def scrape_service(fullname: str) -> str:
    """The headless Service whose DNS names the replicas' Pod addresses for Prometheus."""
    return f"{fullname}-server-scrape"


def prometheus_config(targets: Iterable[tuple[str, str]]) -> str:
    """Scrape the replicas of each ``(namespace, fullname)`` release as job
    ``<fullname>-server`` with its ``namespace`` label, as the chart's ServiceMonitor
    makes the Prometheus Operator do.

    Debian's prometheus is built without Kubernetes service discovery: the
    replicas are found through DNS, the A records of a headless Service over their
    Pods (:func:`scrape_service`), asked again every 2 s. A Pod that is not Ready
    (a draining replica) leaves the records, as it leaves the Service's endpoints.
    """
    jobs = []
    for namespace, fullname in targets:
        jobs.append(
            {
                "job_name": f"{fullname}-server",
                "scrape_interval": f"{SCRAPE_SECONDS}s",
                "scrape_timeout": f"{SCRAPE_SECONDS}s",
                "dns_sd_configs": [
                    {
                        "names": [f"{scrape_service(fullname)}.{namespace}.svc.cluster.local"],
                        "type": "A",
                        "port": SERVER_PORT,
                        "refresh_interval": f"{SCRAPE_SECONDS}s",
                    }
                ],
                "relabel_configs": [{"target_label": "namespace", "replacement": namespace}],
            }
        )
    return yaml.safe_dump(
        {"global": {"scrape_interval": f"{SCRAPE_SECONDS}s"}, "scrape_configs": jobs}
    )


def scrape_manifests(targets: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each release's namespace and the headless Service over its replica Pods."""
    out: list[dict[str, Any]] = []
    for namespace, fullname in targets:
        release = fullname if "mcpfleet" in fullname else fullname.removesuffix("-mcpfleet")
        out += [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": scrape_service(fullname), "namespace": namespace},
                "spec": {
                    "clusterIP": "None",
                    "selector": {
                        "app.kubernetes.io/instance": release,
                        "app.kubernetes.io/component": "server",
                    },
                    "ports": [{"name": "http", "port": SERVER_PORT}],
                },
            },
        ]
    return out


def prometheus_manifests(image: str, targets: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    ns, name = PROMETHEUS_NAMESPACE, PROMETHEUS_SERVICE
    labels = {"app.kubernetes.io/name": "prometheus"}
    targets = list(targets)
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        *scrape_manifests(targets),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns},
            "data": {"prometheus.yml": prometheus_config(targets)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "securityContext": {"runAsNonRoot": True},
                        "containers": [
                            {
                                "name": "prometheus",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": [
                                    "--config.file=/etc/prometheus/prometheus.yml",
                                    "--storage.tsdb.path=/prometheus",
                                    "--storage.tsdb.retention.time=2h",
                                    "--web.listen-address=:9090",
                                ],
                                "ports": [{"name": "web", "containerPort": 9090}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/-/ready", "port": "web"},
                                    "periodSeconds": 2,
                                },
                                "volumeMounts": [
                                    {"name": "config", "mountPath": "/etc/prometheus"},
                                    {"name": "data", "mountPath": "/prometheus"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": name}},
                            {"name": "data", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "selector": labels,
                "ports": [{"name": "web", "port": 9090, "targetPort": "web"}],
            },
        },
    ]


def install_prometheus(cluster: Cluster, built: Images, targets: Iterable[tuple[str, str]]) -> None:
    """The Prometheus KEDA's triggers read, scraping each ``(namespace, fullname)``."""
    _load(cluster, [built.prometheus_archive])
    manifests = prometheus_manifests(built.prometheus, targets)
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))
    kubectl(
        cluster,
        "-n",
        PROMETHEUS_NAMESPACE,
        "rollout",
        "status",
        f"deployment/{PROMETHEUS_SERVICE}",
        "--timeout=300s",
        timeout=330,
    )


def uninstall(cluster: Cluster, built: Images) -> None:
    """KEDA and the Prometheus gone from ``cluster`` (what the tier's other modules share)."""
    docs = keda_manifests(built.keda) + prometheus_manifests(built.prometheus, [])
    kubectl(
        cluster,
        "delete",
        "--ignore-not-found",
        "--wait=true",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(reversed(docs)),
        timeout=600,
    )


def _load(cluster: Cluster, archives: Iterable[Path]) -> None:
    if cluster.provider != "kind":
        raise RuntimeError(f"the autoscaling tier runs on kind, not on {cluster.provider}")
    from fleetkit.cluster import kind

    # Into the workers only: the control-plane node is tainted, nothing of these runs there.
    workers = [
        name_of(n)
        for n in k8s.CoreV1Api(cluster.api)
        .list_node(label_selector="!node-role.kubernetes.io/control-plane")
        .items
    ]
    for archive in archives:
        kind.load_archive(cluster.kind_name, archive, workers)


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fleetkit.cluster.autoscaler install|uninstall``: KEDA and the
    Prometheus on the kind cluster ``make kind-up`` made (deploy/kind/up.sh with
    AUTOSCALING=1 runs it)."""
    parser = argparse.ArgumentParser(
        prog="python -m fleetkit.cluster.autoscaler", description=main.__doc__
    )
    parser.add_argument("command", choices=["install", "uninstall"])
    parser.add_argument("--name", default="mcpfleet", help="the kind cluster")
    parser.add_argument("--namespace", default="mcpfleet", help="the release's namespace")
    parser.add_argument(
        "--release", default="mcpfleet", help="the release whose replicas to scrape"
    )
    parser.add_argument(
        "--no-prometheus",
        action="store_true",
        help="KEDA only: a Prometheus of yours serves prometheus-operated.monitoring",
    )
    args = parser.parse_args(argv)
    from kubernetes import config as k8s_config

    from fleetkit.cluster import kind

    kubeconfig = kind.state_dir(args.name) / "kubeconfig"
    if not kubeconfig.exists():
        parser.error(f"no kind cluster {args.name} (make kind-up KIND_CLUSTER={args.name})")
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    cluster = Cluster(
        provider="kind",
        kubeconfig=kubeconfig,
        api=api,
        values={},
        reach=lambda ns, svc, port: (svc, port),
        kind_name=args.name,
    )
    built = images()
    if args.command == "install":
        install_keda(cluster, built)
        print(f"keda: {built.keda} serving external metrics")
        if not args.no_prometheus:
            fullname = args.release if "mcpfleet" in args.release else f"{args.release}-mcpfleet"
            install_prometheus(cluster, built, [(args.namespace, fullname)])
            print(
                f"prometheus: {PROMETHEUS_SERVICE}.{PROMETHEUS_NAMESPACE}:9090"
                f" scraping {fullname}-server"
            )
    else:
        uninstall(cluster, built)
        print("keda and prometheus: uninstalled")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
