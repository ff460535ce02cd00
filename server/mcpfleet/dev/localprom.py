"""A local Prometheus (Debian's ``prometheus`` binary) scraping a fleet on 127.0.0.1.

``mcpfleet dev`` starts one next to its fleet so a person can watch asking vs
final rounds without a cluster, and the fleet tests start one to evaluate
every dashboard query and alert expression against real scrapes. Targets live
in a file-based service discovery file, so replicas added later are scraped
without a restart; each target carries the ``namespace`` and ``pod`` labels a
ServiceMonitor would give it in a cluster, so the same dashboards work.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from mcpfleet.dev.ports import free_port

#: The alert rules, where a source checkout (or editable install) has them.
RULES_FILE = (
    Path(__file__).resolve().parents[3] / "charts" / "mcpfleet" / "rules" / ("mcpfleet.rules.yaml")
)

#: Job names: the chart's ServiceMonitors use the same.
REPLICA_JOB = "mcpfleet-server"
ROUTER_JOB = "mcpfleet-router"

#: The graph a person opens first: asking vs final rounds.
ROUNDS_GRAPH = "sum by (kind, era) (rate(mcpfleet_rounds_total[1m]))"


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered a query with an error."""


@dataclass(frozen=True)
class Target:
    """One process to scrape: its ``host:port``, job and pod name."""

    address: str
    job: str
    pod: str


def _unix(rfc3339: str) -> float:
    """Prometheus's nanosecond RFC 3339 timestamps, as Unix time."""
    text = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def find_prometheus() -> str | None:
    return shutil.which("prometheus")


def render_config(
    targets_file: Path, *, interval: float, rules: Sequence[Path] = ()
) -> dict[str, Any]:
    """The Prometheus configuration: every job from one file_sd file, rules if given."""
    every = f"{max(interval, 0.1):g}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {
                "job_name": "mcpfleet",
                "scrape_timeout": every,
                # Each target's own ``job`` label (replica or router) wins over this name.
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            }
        ],
    }


def render_targets(targets: Sequence[Target], namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "targets": [t.address],
            "labels": {"job": t.job, "namespace": namespace, "pod": t.pod},
        }
        for t in targets
    ]


def graph_url(base: str, expr: str = ROUNDS_GRAPH) -> str:
    query = urllib.parse.urlencode({"g0.expr": expr, "g0.tab": "0", "g0.range_input": "15m"})
    return f"{base}/graph?{query}"


@dataclass
class LocalPrometheus:
    """One Prometheus process with its own config and data under ``workdir``."""

    workdir: Path
    namespace: str
    interval: float = 5.0
    rules: Sequence[Path] = ()
    binary: str | None = field(default_factory=find_prometheus)
    port: int = 0
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets_file(self) -> Path:
        return self.workdir / "targets.json"

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    def set_targets(self, targets: Sequence[Target]) -> None:
        """Write the target list atomically; Prometheus picks it up by itself."""
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(render_targets(targets, self.namespace), indent=2))
        tmp.replace(self.targets_file)

    def start(self, targets: Sequence[Target], timeout: float = 30.0) -> None:
        if self.binary is None:
            raise PrometheusError("prometheus not found: apt-get install prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.set_targets(targets)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            json.dumps(
                render_config(self.targets_file, interval=self.interval, rules=self.rules),
                indent=2,
            )
        )
        self.port = self.port or free_port()
        argv = [
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--web.enable-lifecycle",
        ]
        with self.log.open("ab") as fh:
            self.popen = subprocess.Popen(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.popen.poll() is not None:
                raise PrometheusError(f"prometheus exited:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- the HTTP API ----------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, else PrometheusError."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def scraped_since(self, when: float, scrapes: int = 2) -> bool:
        """True once every active target was scraped ``scrapes`` intervals after ``when``."""
        targets = self.api("targets")["activeTargets"]
        if not targets:
            return False
        bound = when + scrapes * self.interval
        return all(_unix(t["lastScrape"]) >= bound for t in targets if t["health"] == "up")

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[Any]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step)
        )
        result: list[Any] = data["result"]
        return result
