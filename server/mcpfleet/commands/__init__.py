"""``mcpfleet``'s subcommands, each a module of one plugin protocol.

The commands: ``serve`` (one replica), ``router``, ``keys``, ``dev`` (a local
fleet), ``demo`` and ``selftest``; the flags they share: ``redisflags`` and
``limitflags``.

A command module has ``COMMANDS`` (the subcommand names it adds),
``add_parsers(sub)`` (their argparse subparsers) and ``run(args) -> int`` (the
exit status). The built-in ones are :data:`BUILTIN`; an installed package
adds its own through the ``mcpfleet.commands`` entry-point group in the same
shape (the operator's ``operator`` and ``rotate``), so :mod:`mcpfleet.cli`
treats every subcommand alike. Also here: what the modules share
(:func:`add_flags`, which makes a process's flags from its table in
:data:`mcpfleet.config.SETTINGS`, :class:`UsageError`, and
:func:`config_from_args`, the one way a config is built from flags); the
flag types are :mod:`mcpfleet.config`'s, reached here too; the Redis flags are
:mod:`mcpfleet.commands.redisflags`'s, which the operator's command uses too.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from mcpfleet import redisconn
from mcpfleet.commands import redisflags
from mcpfleet.config import (
    Flags,
    RedisFlags,
    Setting,
    fleet_name,
    non_negative,
    non_negative_int,
    port,
    positive,
    positive_int,
    share,
)
from mcpfleet.redisconn import RedisFiles, RedisSettings

# The flag types are config's (its tables name them); they are reached here too.
__all__ = [
    "BUILTIN",
    "UsageError",
    "add_flags",
    "add_setting",
    "config_from_args",
    "fleet_name",
    "non_negative",
    "non_negative_int",
    "port",
    "positive",
    "positive_int",
    "redis_fields",
    "redis_settings",
    "share",
]

#: The built-in command modules, in the order ``mcpfleet --help`` lists them.
BUILTIN = (
    "mcpfleet.commands.serve",
    "mcpfleet.commands.router",
    "mcpfleet.commands.keys",
    "mcpfleet.commands.dev",
    "mcpfleet.commands.demo",
    "mcpfleet.commands.selftest",
)

C = TypeVar("C")


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def add_flags(parser: argparse.ArgumentParser, flags: Flags) -> None:
    """A process's flags (:data:`mcpfleet.config.SETTINGS`) on its parser, in the table's order."""
    for row in flags.rows:
        if isinstance(row, RedisFlags):
            redisflags.add_flags(parser, url_help=row.url_help, required=row.required)
        else:
            add_setting(parser, row, row.default_in(flags.config))


def add_setting(parser: argparse.ArgumentParser, setting: Setting, default: Any) -> argparse.Action:
    """One flag of a table, its value in the Namespace attribute named by its config field."""
    given: dict[str, Any] = {"help": setting.help_line(default)}
    if setting.dest != setting.name:
        given["dest"] = setting.dest
    if setting.kind == "switch":
        return parser.add_argument(setting.flag, action="store_true", default=default, **given)
    if setting.kind == "off-switch":
        return parser.add_argument(setting.flag, action="store_false", default=default, **given)
    if setting.dest != setting.name:
        given["metavar"] = setting.name.upper()
    if setting.kind == "repeat":
        return parser.add_argument(setting.flag, action="append", default=list(default), **given)
    if setting.type is not None:
        given["type"] = setting.type
    if setting.choices is not None:
        given["choices"] = setting.choices
    if setting.required:
        return parser.add_argument(setting.flag, required=True, **given)
    return parser.add_argument(setting.flag, default=default, **given)


def redis_settings(args: argparse.Namespace) -> RedisSettings | None:
    """The checked Redis settings of ``serve``/``router``; a UsageError names what to fix."""
    if not args.redis:
        return None
    try:
        return redisflags.from_args(args)
    except redisconn.RedisConfigError as exc:
        raise UsageError(str(exc)) from None


def config_from_args(cls: type[C], args: argparse.Namespace, **given: Any) -> C:
    """``cls`` (a config dataclass) from parsed flags, the one way configs are built.

    Each field takes the flag whose ``dest`` is its name (a repeatable flag's
    list becomes a tuple); a field no flag names keeps its default; ``given``
    sets fields whose values are checked or combined first (the Redis URL and
    files). A flag added with the field's name reaches the config by itself.
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in given:
            values[f.name] = given[f.name]
        elif hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def redis_fields(redis: RedisSettings | None) -> dict[str, Any]:
    """The ``redis_url`` and ``redis_files`` config fields of checked settings."""
    if redis is None:
        return {"redis_url": None, "redis_files": RedisFiles()}
    return {"redis_url": redis.url, "redis_files": redis.files}
