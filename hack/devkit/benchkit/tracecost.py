"""``make bench``'s tracing rows: the replica's and the router's CPU per modern round with
tracing off, and on at 100% and at 1% sampling, side by side.

One run starts three fleets of one replica and one router each, alike but for
their ``OTEL_*`` environment (:mod:`mcpfleet.tracing`):

* off: no ``OTEL_*`` variable (what every other row of ``make bench`` measures);
* on, 100%: OTLP/HTTP export to a receiver in this process
  (:class:`fleetkit.otlp.Receiver`, which counts the exports without decoding
  them), ``parentbased_traceidratio`` at 1.0;
* on, 1%: the same at 0.01.

It drives two-round modern flows (:mod:`benchkit.roundapp`'s ``confirm``,
through :func:`mcpfleet.ask_then`) through each router with no ``traceparent``
(the router starts each trace and samples it; the replica follows its
decision), one client, in slices whose order rotates so that drifting load on
a shared machine hits every fleet alike. Each process's CPU (every thread's,
from ``/proc``) is read around a batch of asking rounds and a batch of their
answer rounds: CPU per asking and per answer round, the replica's and the
router's apart. The export's own work (the batch processor's thread) is in
the figures: it is the process's CPU.

Nothing here asserts: a benchmark reports, tests prove behaviour.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.tracecost [--quick]
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchkit.roundapp import TOOL
from benchkit.roundcost import Server, _round, cpu_ns
from benchkit.table import part_main
from fleetkit.fleet import DEVKIT_DIR
from fleetkit.otlp import Receiver
from mcpfleet.dev.fleet import LocalFleet

Row = tuple[str, str, str, str]

OFF, ON_ALL, ON_ONE = "tracing off", "tracing on, 100% sampled", "tracing on, 1% sampled"
#: The sampling ratio of each traced fleet.
RATIOS = {ON_ALL: "1.0", ON_ONE: "0.01"}


@dataclass
class Traced:
    """One fleet under test: its router (where rounds go), and the replica's and the
    router's CPU per kind of round."""

    name: str
    replica: Server
    router_pid: int
    router_ask_ns: int = 0
    router_answer_ns: int = 0

    @property
    def router_ask_us(self) -> float:
        return self.router_ask_ns / max(1, self.replica.asks) / 1e3

    @property
    def router_answer_us(self) -> float:
        return self.router_answer_ns / max(1, self.replica.answers) / 1e3


def _env(name: str, receiver: Receiver) -> dict[str, str]:
    paths = (str(DEVKIT_DIR), os.environ.get("PYTHONPATH"))  # (a checkout's sources first)
    env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    if name in RATIOS:
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": RATIOS[name],
        }
    return env


def _start(stack: ExitStack, work: Path, name: str, receiver: Receiver) -> Traced:
    index = [OFF, ON_ALL, ON_ONE].index(name)
    lf = LocalFleet(
        work / f"fleet-{index}",
        replicas=1,
        routers=1,
        fleet=f"traces{index}",
        app="benchkit.roundapp:fleet",
        extra_env=_env(name, receiver),
        limits=False,
    )
    stack.callback(lf.stop)
    lf.start()
    member = lf.members["replica-0"]
    assert member.proc.popen is not None and lf.router_procs[0].popen is not None
    replica = Server(name, lf.url, TOOL, member.proc.popen.pid)
    return Traced(name, replica, lf.router_procs[0].popen.pid)


def _batch(http: httpx.Client, t: Traced, flows: int, timed: bool = True) -> None:
    """``flows`` asking rounds, then their answer rounds, both processes' CPU read around
    each batch."""
    s = t.replica
    states: list[str] = []
    before = cpu_ns(s.pid), cpu_ns(t.router_pid)
    for _ in range(flows):
        took, result = _round(http, s, None)
        states.append(str(result["requestState"]))
        if timed:
            s.ask_ms.append(took)
    between = cpu_ns(s.pid), cpu_ns(t.router_pid)
    for state in states:
        took, _ = _round(http, s, state)
        if timed:
            s.answer_ms.append(took)
    after = cpu_ns(s.pid), cpu_ns(t.router_pid)
    if timed:
        s.ask_ns += between[0] - before[0]
        s.answer_ns += after[0] - between[0]
        t.router_ask_ns += between[1] - before[1]
        t.router_answer_ns += after[1] - between[1]
        s.asks += flows
        s.answers += flows


def measure(flows: int, slice_flows: int, work: Path) -> tuple[list[Traced], int]:
    """The three fleets started, warmed up and driven; what was measured, and the
    export requests the receiver got."""
    with ExitStack() as stack:
        receiver = stack.enter_context(Receiver(keep=False))
        fleets = [_start(stack, work, name, receiver) for name in (OFF, ON_ALL, ON_ONE)]
        with httpx.Client(timeout=10) as http:
            for t in fleets:  # warm every path up: imports, caches, connections
                _batch(http, t, 50, timed=False)
            for i in range(max(1, flows // slice_flows)):
                shift = i % len(fleets)
                for t in fleets[shift:] + fleets[:shift]:
                    _batch(http, t, slice_flows)
        return fleets, receiver.exports


def rows_of(fleets: list[Traced], exports: int) -> list[Row]:
    off = fleets[0]
    rows: list[Row] = []
    for t in fleets:
        s = t.replica
        for who, ask, answer, base_ask, base_answer in (
            ("replica", s.ask_us, s.answer_us, off.replica.ask_us, off.replica.answer_us),
            (
                "router",
                t.router_ask_us,
                t.router_answer_us,
                off.router_ask_us,
                off.router_answer_us,
            ),
        ):
            added = "" if t is off else f"{ask - base_ask:+.0f} / {answer - base_answer:+.0f} us"
            rows.append(
                (
                    f"{who} CPU per round ask / answer, {t.name}",
                    f"{ask:.0f} / {answer:.0f} us",
                    added and f"{added} vs off",
                    f"{s.asks} flows through the router, 1 client, interleaved slices",
                )
            )
    rows.append(
        (
            "OTLP/HTTP exports received (both traced fleets)",
            str(exports),
            "",
            "the batch processor's default schedule (5 s)",
        )
    )
    return rows


def trace_cost_rows(quick: bool) -> list[Row]:
    """The rows :mod:`benchkit.bench` prints (``--tracing-only`` prints only these)."""
    flows, slice_flows = (400, 50) if quick else (2000, 100)
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-traces-"))
    try:
        return rows_of(*measure(flows, slice_flows, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    part_main("trace cost", __doc__, trace_cost_rows, "fewer flows (a smoke run)")


if __name__ == "__main__":
    main()
