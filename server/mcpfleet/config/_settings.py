"""What a table of flags is made of: a :class:`Setting` per flag, :class:`Flags` per process.

A flag's default is its config field's unless it names one; a table marks
where the Redis flags (:mod:`mcpfleet.commands.redisflags`, declared there for
the operator too, which may not import this package) go with :class:`RedisFlags`.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

#: A :class:`Setting`'s default when it names none: its config field's.
FROM_CONFIG: Any = object()


@dataclass(frozen=True)
class Setting:
    """One flag of a process: its name, how its value is read, its help line.

    ``kind``: ``value`` takes one (read by ``type``, one of ``choices``);
    ``switch`` turns its field on and ``off-switch`` off; ``repeat`` adds one
    value each time it is given. ``help`` may name the default as ``{default}``
    (or ``{default:g}``). ``field`` is the config field (and the Namespace's
    attribute) it sets, when not the flag's own name. ``env``: the variable the
    process reads when the flag is not given. ``chart``: the chart value (a
    path in values.yaml) the chart passes it from, and ``chart_differs`` why
    that value's default is not the flag's, if it is not.
    """

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    kind: Literal["value", "switch", "off-switch", "repeat"] = "value"
    field: str = ""
    default: Any = FROM_CONFIG
    choices: tuple[str, ...] | None = None
    required: bool = False
    env: str | None = None
    chart: str | None = None
    chart_differs: str = ""

    @property
    def name(self) -> str:
        """The flag's own name as argparse makes it a name: ``--state-ttl`` is ``state_ttl``."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def dest(self) -> str:
        """The config field and Namespace attribute the flag sets."""
        return self.field or self.name

    def default_in(self, config: builtins.type) -> Any:
        """The default: the one declared here, else ``config``'s field's (None if it has none)."""
        if self.default is not FROM_CONFIG:
            return self.default
        (f,) = [f for f in dataclasses.fields(config) if f.name == self.dest]
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return None

    def help_line(self, default: Any) -> str:
        return self.help.format(default=default)

    def said(self, help: str, *, chart: str | None = None, chart_differs: str = "") -> Setting:
        """This flag in one process's words (``help``), passed from ``chart`` there."""
        return dataclasses.replace(self, help=help, chart=chart, chart_differs=chart_differs)


@dataclass(frozen=True)
class RedisFlags:
    """Where a table takes the Redis flags (:mod:`mcpfleet.commands.redisflags`)."""

    url_help: str
    required: bool = False


@dataclass(frozen=True)
class Flags:
    """A process's flags in ``--help``'s order, their defaults from ``config``."""

    config: type
    rows: tuple[Setting | RedisFlags, ...]

    def settings(self) -> list[Setting]:
        return [row for row in self.rows if isinstance(row, Setting)]

    def defaults(self) -> dict[str, Any]:
        """Every flag's default, by flag."""
        return {s.flag: s.default_in(self.config) for s in self.settings()}
