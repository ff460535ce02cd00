"""Helpers of the fleet tier's MCP tasks tests (``test_tasks*.py``): the task app,
replicas other than a task's creator, polling tasks to their end, the side effects
file, the replicas' task metrics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetkit.clients.taskwire import FINAL, task
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for

APP = "fleetkit.apps.taskapp:app"


#: Seconds after which a dead worker's task runs again elsewhere (--tasks-redelivery).
REDELIVERY = 2.0


def replica_urls(lf: LocalFleet) -> dict[str, str]:
    return {name: f"{r.url}/mcp" for name, r in lf.members.items()}


def elsewhere(lf: LocalFleet, creator: str | None, turn: int) -> tuple[str, str]:
    """A replica other than ``creator`` (the ``turn``-th of them, round robin)."""
    others = sorted(n for n in lf.members if n != creator)
    name = others[turn % len(others)]
    return name, replica_urls(lf)[name]


def status_of(http: httpx.Client, url: str, task_id: str, token: str | None) -> dict[str, Any]:
    answer = task(http, url, "tasks/get", task_id, token=token)
    assert answer.error is None, answer.body
    return answer.result


def wait_final(
    http: httpx.Client, url: str, ids: list[str], token: str | None, timeout: float
) -> dict[str, dict[str, Any]]:
    """Every task's final ``tasks/get`` result, polled through ``url`` until ``timeout``."""
    final: dict[str, dict[str, Any]] = {}

    def all_final() -> bool:
        for task_id in ids:
            if task_id not in final:
                result = status_of(http, url, task_id, token)
                if result["status"] in FINAL:
                    final[task_id] = result
        return len(final) == len(ids)

    wait_for(all_final, timeout=timeout, what=f"{len(ids)} task(s) to end", interval=0.2)
    return final


def effects(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(http: httpx.Client, lf: LocalFleet) -> dict[str, dict[Sample, float]]:
    """Each live replica's ``mcpfleet_tasks_*`` samples, by replica."""
    out: dict[str, dict[Sample, float]] = {}
    for name, member in lf.members.items():
        if not member.proc.alive:
            continue
        text = http.get(f"{member.url}/metrics").text
        out[name] = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("mcpfleet_tasks_") and not s.name.endswith("_created")
        }
    return out


def fleet_sum(scraped: dict[str, dict[Sample, float]]) -> Counter[Sample]:
    total = Counter[Sample]()
    for samples in scraped.values():
        for key, value in samples.items():
            if key[0].endswith("_total"):
                total[key] += value
    return total


def _starts(log: Path, tags: set[str]) -> dict[str, list[str]]:
    """The pids each tagged task started on, in order."""
    found: dict[str, list[str]] = {}
    for line in effects(log):
        kind, tag, pid = line.split()
        if kind == "start" and tag in tags:
            found.setdefault(tag, []).append(pid.removeprefix("pid="))
    return found


def _victim(lf: LocalFleet, pids: dict[str, list[str]]) -> tuple[str, str, int]:
    """The replica running the most of these tasks: its name, pid and load."""
    pid, load = Counter(p[0] for p in pids.values()).most_common(1)[0]
    name = next(
        n
        for n, r in lf.members.items()
        if r.proc.popen is not None and str(r.proc.popen.pid) == pid
    )
    return name, pid, load
