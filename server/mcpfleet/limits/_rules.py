"""The limits in force: one value, read from flags and an optional file, swapped whole.

A limit is named (``sessions``, ``rounds``, ``tasks``, ``listen``), keyed by principal, and
is a count (a cap on what a principal holds at once) or a rate (a refill per
second with a burst). :class:`LimitRules` holds the fleet's defaults, an
override per tool (rounds only: an expensive tool gets a tighter rate) and an
override per principal (by its digest: a service account that needs more).
``0`` means unlimited for any number here.

The file (``--limits-file``, a ConfigMap's key in the chart) is JSON::

    {"sessions": 100,
     "listen": 20,
     "rounds": {"rate": 50, "burst": 100},
     "tasks": {"cap": 200, "running": 4},
     "tools": {"render_report": {"rate": 1, "burst": 3}},
     "principals": {"3f0c...": {"sessions": 1000, "rounds": {"rate": 500, "burst": 1000}}}}

Every key is optional: what the file leaves out keeps the value of the flags.
A file that cannot be read or parsed never replaces the rules in force
(:func:`load_rules` raises :class:`RulesError`, naming the field).
"""

from __future__ import annotations

import contextvars
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CURRENT_PRINCIPAL",
    "LIMIT_NAMES",
    "Count",
    "LimitRules",
    "PrincipalRule",
    "Rate",
    "RulesError",
    "load_rules",
    "parse_rules",
]

#: Every limit's name, as the metric's ``limit`` label and the error's ``data.limit``.
LIMIT_NAMES: Final = ("sessions", "rounds", "tasks", "listen")

#: The principal of the request being served (a digest, or ``addr:<digest>`` for an
#: unauthenticated client, or ``shared``), set by the replica's limit gate before the
#: app runs: code deeper in (a task's creation) reads it instead of recomputing it.
CURRENT_PRINCIPAL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcpfleet_principal", default=None
)


class RulesError(ValueError):
    """A limits file or value that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Rate:
    """``rate`` requests per second, up to ``burst`` at once; ``rate`` 0 is unlimited."""

    rate: float = 0.0
    burst: int = 0

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def effective_burst(self) -> int:
        """The burst, at least one request (a rate with burst 0 still lets one through)."""
        return max(1, self.burst)


@dataclass(frozen=True)
class Count:
    """A cap on what one principal holds at once: ``cap`` 0 is unlimited.

    ``running`` is the tasks limit's second number: how many of a principal's
    tasks the fleet's workers run at once (the rest wait, in order, while other
    principals' tasks run); 0 is no share.
    """

    cap: int = 0
    running: int = 0


@dataclass(frozen=True)
class PrincipalRule:
    """What one principal gets instead of the defaults (None: the default)."""

    sessions: int | None = None
    rounds: Rate | None = None
    tasks: Count | None = None
    listen: int | None = None


@dataclass(frozen=True)
class LimitRules:
    """The limits in force. Pure data; replaced whole when the file changes."""

    sessions: int = 0
    rounds: Rate = field(default_factory=Rate)
    tasks: Count = field(default_factory=Count)
    tools: Mapping[str, Rate] = field(default_factory=dict)
    #: ``subscriptions/listen`` streams one principal holds open at once, fleet-wide.
    listen: int = 0
    principals: Mapping[str, PrincipalRule] = field(default_factory=dict)

    def sessions_for(self, principal: str) -> int:
        rule = self.principals.get(principal)
        if rule is not None and rule.sessions is not None:
            return rule.sessions
        return self.sessions

    def listen_for(self, principal: str) -> int:
        rule = self.principals.get(principal)
        if rule is not None and rule.listen is not None:
            return rule.listen
        return self.listen

    def rounds_for(self, principal: str) -> Rate:
        rule = self.principals.get(principal)
        if rule is not None and rule.rounds is not None:
            return rule.rounds
        return self.rounds

    def tool_rate(self, tool: str) -> Rate | None:
        """The tighter rate of ``tool`` (for every principal), or None."""
        return self.tools.get(tool) if self.tools else None

    def tasks_for(self, principal: str) -> Count:
        rule = self.principals.get(principal)
        if rule is not None and rule.tasks is not None:
            return rule.tasks
        return self.tasks

    @property
    def any(self) -> bool:
        """Whether any limit is set (all off: the gate costs nothing)."""
        return bool(
            self.sessions
            or self.listen
            or not self.rounds.unlimited
            or self.tasks.cap
            or self.tasks.running
            or self.tools
            or self.principals
        )


def _number(value: Any, where: str, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RulesError(f"{where}: expected a number, got {json.dumps(value)}")
    if not math.isfinite(value) or value < 0:
        raise RulesError(f"{where}: must be a finite number >= 0, got {value}")
    if integer and value != int(value):
        raise RulesError(f"{where}: must be a whole number, got {value}")
    return float(value)


def _object(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RulesError(f"{where}: expected an object, got {json.dumps(value)[:80]}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise RulesError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(keys)})")
    return value


def _table(value: Any, where: str) -> dict[str, Any]:
    """An object of named entries (tools, principals): any name, no empty one."""
    doc = _object(value, where, tuple(value) if isinstance(value, dict) else ())
    if "" in doc:
        raise RulesError(f"{where}: an entry with an empty name")
    return doc


def _rate(value: Any, where: str, base: Rate) -> Rate:
    doc = _object(value, where, ("rate", "burst"))
    rate = _number(doc["rate"], f"{where}.rate", integer=False) if "rate" in doc else base.rate
    burst = (
        int(_number(doc["burst"], f"{where}.burst", integer=True)) if "burst" in doc else base.burst
    )
    return Rate(rate, burst)


def _count(value: Any, where: str, base: Count) -> Count:
    doc = _object(value, where, ("cap", "running"))
    cap = int(_number(doc["cap"], f"{where}.cap", integer=True)) if "cap" in doc else base.cap
    running = (
        int(_number(doc["running"], f"{where}.running", integer=True))
        if "running" in doc
        else base.running
    )
    return Count(cap, running)


def _principal(value: Any, where: str, base: LimitRules) -> PrincipalRule:
    doc = _object(value, where, ("sessions", "rounds", "tasks", "listen"))
    sessions = listen = None
    if "sessions" in doc:
        sessions = int(_number(doc["sessions"], f"{where}.sessions", integer=True))
    if "listen" in doc:
        listen = int(_number(doc["listen"], f"{where}.listen", integer=True))
    rounds = _rate(doc["rounds"], f"{where}.rounds", base.rounds) if "rounds" in doc else None
    tasks = _count(doc["tasks"], f"{where}.tasks", base.tasks) if "tasks" in doc else None
    return PrincipalRule(sessions, rounds, tasks, listen)


def parse_rules(doc: Any, base: LimitRules) -> LimitRules:
    """``base`` (the flags' rules) with what ``doc`` (a parsed limits file) sets.

    Raises :class:`RulesError` naming the first field that is wrong.
    """
    top = _object(doc, "limits", ("sessions", "rounds", "tasks", "listen", "tools", "principals"))
    rules = base
    if "sessions" in top:
        rules = replace(rules, sessions=int(_number(top["sessions"], "sessions", integer=True)))
    if "listen" in top:
        rules = replace(rules, listen=int(_number(top["listen"], "listen", integer=True)))
    if "rounds" in top:
        rules = replace(rules, rounds=_rate(top["rounds"], "rounds", base.rounds))
    if "tasks" in top:
        rules = replace(rules, tasks=_count(top["tasks"], "tasks", base.tasks))
    if "tools" in top:
        tools = _object(
            top["tools"], "tools", tuple(top["tools"]) if isinstance(top["tools"], dict) else ()
        )
        rules = replace(
            rules, tools={str(k): _rate(v, f"tools.{k}", Rate()) for k, v in tools.items()}
        )
    if "principals" in top:
        doc_p = _table(top["principals"], "principals")
        rules = replace(
            rules,
            principals={str(k): _principal(v, f"principals.{k}", rules) for k, v in doc_p.items()},
        )
    return rules


def load_rules(path: Path, base: LimitRules) -> LimitRules:
    """The rules of the limits file at ``path`` over ``base``; :class:`RulesError` if unusable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RulesError(f"limits file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RulesError(f"limits file {path}: not UTF-8") from None
    if not text.strip():
        return base
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise RulesError(f"limits file {path}: not JSON ({e.msg}, line {e.lineno})") from None
    return parse_rules(doc, base)
