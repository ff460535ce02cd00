"""The node tier's figures for ``make bench``: key ring refresh through the real kubelet.

From the Secret write to every replica pod attesting the new ring, with and
without the pod annotation nudge the operator applies after each write
(:data:`~mcpfleet.contract.KEYRING_NUDGE_ANNOTATION`). Without it the
kubelet refreshes a Secret volume only at its next periodic sync of the pod
(``syncFrequency``, one minute by default, plus jitter); a changed pod is
synced at once. Measured, never asserted: the tests only require convergence.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from fleetkit.cluster.controlplane import temporary_namespace
from fleetkit.cluster.node import Node, node_missing
from fleetkit.cluster.nodefleet import NodeFleet, node_fleet
from mcpfleet.dev.fleet import FleetError

Row = tuple[str, str, str, str]


def refresh_seconds(nf: NodeFleet, step: str, timeout: float = 240.0) -> float:
    """Seconds from one ring step written to the Secret to every pod attesting it."""
    start = time.monotonic()
    ring = nf.rotate_step(step)
    nf.wait_attested(ring.kids, timeout=timeout)
    return time.monotonic() - start


def node_rows(quick: bool) -> list[Row]:
    """Rows for the bench table; one row saying why when no node can run here, or
    why the node's fleet failed (the rest of the table is measured by then)."""
    reasons = node_missing()
    if reasons:
        return [("key ring refresh via kubelet", "skipped", "", "; ".join(reasons)[:60])]
    try:
        return _measured_rows(quick)
    except (FleetError, TimeoutError, OSError) as exc:
        print(f"make bench: the node's rows failed: {exc}", file=sys.stderr)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [("key ring refresh via kubelet", "failed", "", why[:60])]


def _measured_rows(quick: bool) -> list[Row]:
    samples_nudged = 2 if quick else 4
    samples_plain = 1 if quick else 2
    with tempfile.TemporaryDirectory(prefix="mcpfleet-node-bench-") as tmp:
        work = Path(tmp)
        node = Node(workdir=work / "node")
        started = time.monotonic()
        node.start()
        node_start = time.monotonic() - started
        try:
            with (
                temporary_namespace(node.api_client(), "bench") as namespace,
                node_fleet(node, namespace, work / "fleet", replicas=3) as nf,
            ):
                fleet_start = time.monotonic() - started - node_start
                nudged, plain = [], []
                for i in range(samples_nudged):
                    nudged.append(refresh_seconds(nf, "stage" if i % 2 == 0 else "abort"))
                nf.nudge = False
                for i in range(samples_plain):
                    plain.append(refresh_seconds(nf, "stage" if i % 2 == 0 else "abort"))
        finally:
            node.stop()
    med_n, med_p = statistics.median(nudged), statistics.median(plain)
    return [
        ("node start (plane, containerd, image import, kubelet)", f"{node_start:.0f} s", "", ""),
        ("3 replica pods serving + router", f"{fleet_start:.0f} s", "", "Deployment of the image"),
        (
            "Secret write -> all pods attest, nudged",
            f"p50 {med_n:.1f} s",
            "",
            f"{len(nudged)} steps, annotation bump",
        ),
        (
            "Secret write -> all pods attest, no nudge",
            f"p50 {med_p:.1f} s",
            f"x{med_p / med_n:.0f} of nudged",
            f"{len(plain)} steps, kubelet sync period",
        ),
    ]
