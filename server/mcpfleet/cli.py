"""The ``mcpfleet`` command line.

Subcommands: ``serve`` (one replica), ``router``, ``keys`` (generate and
rotate a local key ring directory), ``dev`` (a whole local fleet), ``demo``
(a real client run against a fleet), ``selftest``, and ``operator`` and
``rotate`` (the key ring operator and its client, in ``mcpfleet_operator.cli``).
Each is a module of one plugin protocol (:mod:`mcpfleet.commands`): the
built-in ones and those installed packages add are found and run alike.
Errors a user can fix are printed as one clear line and exit with status 2;
nothing prints key material.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from mcpfleet import __version__
from mcpfleet.commands import BUILTIN, UsageError
from mcpfleet.replica.appload import AppLoadError

log = logging.getLogger("mcpfleet")


class HelpWithDefaults(argparse.HelpFormatter):
    """Every flag's help line ends with its default, unless it names one already
    (or has none worth naming: a switch, an empty list, no value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default in ([], "", ())
        ):
            return text
        return f"{text} (default: %(default)s)"


#: The entry-point group through which installed packages add subcommands.
COMMANDS_GROUP = "mcpfleet.commands"


def command_plugins() -> list[Any]:
    """Every subcommand module (``COMMANDS``, ``add_parsers``, ``run``): the built-in
    ones, then the installed packages' (pyproject's entry points).

    The operator registers its ``operator`` and ``rotate`` there, so this
    module, and the server package, never import it.
    """
    builtin = [importlib.import_module(name) for name in BUILTIN]
    found = sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)
    return builtin + [ep.load() for ep in found]


def build_parser(plugins: Sequence[Any] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mcpfleet", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    p.add_argument("--version", action="version", version=f"mcpfleet {__version__}")
    p.add_argument(
        "--log-level",
        default=os.environ.get("MCPFLEET_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR ($MCPFLEET_LOG_LEVEL)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for plugin in command_plugins() if plugins is None else plugins:
        plugin.add_parsers(sub)
    p.formatter_class = HelpWithDefaults
    for parser in sub.choices.values():
        parser.formatter_class = HelpWithDefaults
    return p


def main(argv: Sequence[str] | None = None) -> int:
    plugins = command_plugins()
    args = build_parser(plugins).parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Per-request client logs would drown the fleet's own; they say nothing new.
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    plugin = next(p for p in plugins if args.command in p.COMMANDS)
    try:
        return int(plugin.run(args))
    except (UsageError, AppLoadError) as exc:
        print(f"mcpfleet: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
