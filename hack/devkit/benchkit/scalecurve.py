"""The cost curve's arithmetic and rows (:mod:`benchkit.scale`): plain data, no I/O.

A curve is one dimension grown step by step (sessions, replicas in the
registry, routers) and one cost per unit measured at each step. Each step is
printed with its ratio to the first step and a verdict: *flat* while the cost
per unit stays within :data:`FLAT_TOLERANCE` of the first step's (the noise of
a shared machine), else *grows* (or *falls*) by that ratio, and, for growth,
how fast against the dimension: the exponent ``k`` in ``cost ~ units^k``
(about 1: the cost per unit grows as fast as the dimension, so the total
grows with its square).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from benchkit.table import Row

#: A step's cost per unit within this factor of the first step's is "flat".
FLAT_TOLERANCE = 0.3
#: Costs below this are nothing (a net count of commands rounded away).
ZERO = 1e-3
#: A command netting fewer calls than this per unit in a window is the background's
#: noise (a heartbeat that fell in or out of the window), not the path's.
NOISE_PER_UNIT = 0.02


@dataclass(frozen=True)
class Step:
    """One step of a curve: the dimension's size and the cost per unit measured there."""

    units: int
    cost: float
    #: What the number stands on (n requests, the window, the commands behind it).
    note: str = ""


@dataclass
class Curve:
    """One dimension grown step by step, one measure of cost per unit."""

    dimension: str
    measure: str
    unit: str
    steps: list[Step] = field(default_factory=list)
    #: Decimals of the printed cost.
    digits: int = 1

    def add(self, units: int, cost: float, note: str = "") -> None:
        self.steps.append(Step(units, cost, note))


def ratio(first: float, cost: float) -> float | None:
    """``cost / first``; None when the first step cost nothing (no ratio to it)."""
    if abs(first) < ZERO:
        return 1.0 if abs(cost) < ZERO else None
    return cost / first


def verdict(first: Step, step: Step, tolerance: float = FLAT_TOLERANCE) -> str:
    """Whether ``step``'s cost per unit is flat against ``first``'s, or by what it grows."""
    if step is first:
        return "first step"
    growth = step.units / first.units if first.units else float("inf")
    r = ratio(first.cost, step.cost)
    if r is None:
        return f"grows from 0 to {step.cost:g} (x{growth:g} units)"
    if 1 / (1 + tolerance) <= r <= 1 + tolerance:
        return f"flat (x{r:.2f} for x{growth:g} units)"
    if r < 1:
        return f"falls x{r:.2f} for x{growth:g} units"
    k = math.log(r) / math.log(growth) if growth > 1 else float("inf")
    shape = "about linearly in the units" if k >= 0.75 else f"slower than the units (k={k:.2f})"
    return f"grows x{r:.2f} for x{growth:g} units: {shape}"


def curve_rows(curve: Curve) -> list[Row]:
    """One row per step: the measure at that size, its cost, its ratio to the first, verdict."""
    if not curve.steps:
        return []
    first = curve.steps[0]
    rows: list[Row] = []
    for step in curve.steps:
        r = ratio(first.cost, step.cost)
        note = verdict(first, step)
        if step.note:
            note += f"; {step.note}"
        rows.append(
            (
                f"scale, {curve.dimension} {step.units:,}: {curve.measure}",
                f"{step.cost:.{curve.digits}f} {curve.unit}",
                "x-" if r is None else f"x{r:.2f}",
                note,
            )
        )
    return rows


def per_unit(
    before: Mapping[str, int],
    after: Mapping[str, int],
    background: Mapping[str, float],
    seconds: float,
    units: int,
) -> dict[str, float]:
    """Commands per unit, by command: the window's deltas less the background rate over
    its length, divided by ``units``; commands netting under half a call, or under
    :data:`NOISE_PER_UNIT` calls per unit, are left out."""
    out: dict[str, float] = {}
    floor = max(0.5, NOISE_PER_UNIT * units)
    for name in set(before) | set(after) | set(background):
        net = after.get(name, 0) - before.get(name, 0) - background.get(name, 0.0) * seconds
        if abs(net) >= floor:
            out[name] = net / units
    return out


def breakdown(commands: Mapping[str, float], units: int | None = None) -> str:
    """``commands`` (per unit) as text, largest first: ``MGET 1.00, SET 0.50``; with
    ``units``, as net counts over that many units instead (``MGET +100``)."""
    ordered = sorted(commands.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    if units is None:
        parts = [f"{name.upper()} {v:.2f}" for name, v in ordered]
    else:
        parts = [f"{name.upper()} {v * units:+.0f}" for name, v in ordered]
    return ", ".join(parts) or "none"


def total(commands: Mapping[str, float]) -> float:
    """The sum of ``commands``, never ``-0.0``."""
    return round(sum(commands.values()), 3) or 0.0


@dataclass(frozen=True)
class PathCost:
    """Redis commands per round of one path, net of the background."""

    path: str
    commands: dict[str, float]
    rounds: int
    note: str = ""
    #: What one master's ceiling counts for this path: its commands/s over the path's
    #: commands per unit (per round; per held session per second: sessions held).
    ceiling_unit: str = "rounds/s"


def path_rows(paths: Sequence[PathCost]) -> list[Row]:
    """``Redis commands per round, <path>``: the total, then what it is made of (a path
    counted per held session per second says so in its name)."""
    return [
        (
            f"scale, Redis commands per round, {p.path}",
            f"{total(p.commands):.2f}",
            breakdown(p.commands, p.rounds),
            f"n={p.rounds}" + (f"; {p.note}" if p.note else ""),
        )
        for p in paths
    ]


def first_limit(capacity: float, paths: Sequence[PathCost]) -> list[Row]:
    """What one Redis master sustains of each path: its commands/s over the path's
    commands per round (paths that cost Redis nothing are not bounded by it)."""
    rows: list[Row] = []
    for p in paths:
        per_round = total(p.commands)
        if per_round < NOISE_PER_UNIT:
            value, note = "not bounded by Redis", "no Redis command on this path"
        else:
            value = f"{capacity / per_round:,.0f} {p.ceiling_unit}"
            note = f"{capacity:,.0f} commands/s / {per_round:.2f} commands per unit"
        rows.append((f"scale, one Redis master's ceiling, {p.path}", value, "", note))
    return rows
