"""``mcpfleet``'s subcommands, each a module of one plugin protocol.

A command module has ``COMMANDS`` (the subcommand names it adds),
``add_parsers(sub)`` (their argparse subparsers) and ``run(args) -> int`` (the
exit status). The built-in ones are :data:`BUILTIN`; an installed package
adds its own through the ``mcpfleet.commands`` entry-point group in the same
shape (the operator's ``operator`` and ``rotate``), so :mod:`mcpfleet.cli`
treats every subcommand alike. Also here: what the modules share (the flag
types, :class:`UsageError`, and :func:`config_from_args`, the one way a
config is built from flags); the Redis flags are
:mod:`mcpfleet.commands.redisflags`'s, which the operator's command uses too.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from mcpfleet import redisconn
from mcpfleet.commands import redisflags
from mcpfleet.contract import check_fleet_name
from mcpfleet.redisconn import RedisFiles, RedisSettings

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


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def fleet_name(text: str) -> str:
    try:
        return check_fleet_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_listen_flags(parser: argparse.ArgumentParser, config: Any) -> None:
    """``--host`` and ``--port`` of a process, their defaults from its ``config`` class."""
    parser.add_argument("--host", default=config.host, help="address to listen on")
    parser.add_argument("--port", type=port, default=config.port, help="port to listen on")


def add_fleet_flag(parser: argparse.ArgumentParser, default: str) -> None:
    """``--fleet``: the same for every component of a fleet."""
    parser.add_argument(
        "--fleet",
        type=fleet_name,
        default=default,
        help="the fleet's name: its Redis keys' prefix, the same for every component",
    )


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
