"""The flags of ``mcpfleet serve``, ``router``, ``dev`` and ``operator`` are what users rely on.

``flags_before.json`` holds what the parsers showed when each flag was still
declared by hand in its command's ``add_parsers``: every flag's option strings,
dest, type, default, choices, metavar and help line (as ``--help`` prints it),
the whole ``--help`` text, and the Namespace of ``parse_args`` with nothing but
the required flags, attribute by attribute in order. The parsers made now from
:data:`mcpfleet.config.SETTINGS` must show the same: the move to one table
changed nothing a user or a script can see.

A flag added on purpose is added to the fixture by running this file
(``.venv/bin/python tests/unit/test_flags_unchanged.py``) and reviewing the diff.

The help texts are compared with a flag of a short and a long form written as
Python 3.13's argparse writes it, its metavar named once (``-n, --namespace
NAMESPACE``; earlier Pythons print ``-n NAMESPACE, --namespace NAMESPACE``): the
fixture was made on 3.11, and the flags are the same on every Python the project
supports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from mcpfleet import cli

FIXTURE = Path(__file__).with_name("data") / "flags_before.json"

#: Each command with the fewest arguments it parses with.
REQUIRED = {
    "serve": ["--keys", "/k"],
    "router": ["--redis", "redis://127.0.0.1:6379/0"],
    "dev": [],
    "operator": [],
}
#: A fixed width, so that --help wraps the same everywhere.
COLUMNS = "100"
#: A flag's short and long form, each with the metavar, as argparse before 3.13 prints it.
_BOTH_FORMS = re.compile(r"(?m)^(\s+)(-\w) (\S+), (--[\w-]+) \3$")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _type_name(kind: Any) -> str | None:
    return None if kind is None else getattr(kind, "__name__", repr(kind))


def _action(parser: argparse.ArgumentParser, action: argparse.Action) -> dict[str, Any]:
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "class": type(action).__name__,
        "type": _type_name(action.type),
        "default": repr(action.default),
        "required": action.required,
        "choices": None if action.choices is None else list(action.choices),
        "nargs": repr(action.nargs),
        "const": repr(action.const),
        "metavar": action.metavar,
        "help": parser._get_formatter()._expand_help(action) if action.help else None,
    }


def observed() -> dict[str, Any]:
    """What the parsers show of every flag, the help text and the parsed defaults."""
    saved = {name: os.environ.pop(name, None) for name in ("COLUMNS", "MCPFLEET_LOG_LEVEL")}
    os.environ["COLUMNS"] = COLUMNS
    try:
        out: dict[str, Any] = {}
        parsers = _subparsers()
        for command, argv in REQUIRED.items():
            parser = parsers[command]
            namespace = cli.build_parser().parse_args([command, *argv])
            out[command] = {
                "actions": [_action(parser, a) for a in parser._actions],
                "namespace": [[k, repr(v)] for k, v in vars(namespace).items()],
                "help": parser.format_help(),
            }
        return out
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


BEFORE: dict[str, Any] = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
NOW = observed()


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_every_flag_has_the_option_strings_type_default_and_help_it_had(command: str) -> None:
    before = {tuple(a["option_strings"]) or a["dest"]: a for a in BEFORE[command]["actions"]}
    now = {tuple(a["option_strings"]) or a["dest"]: a for a in NOW[command]["actions"]}
    assert list(now) == list(before), "flags added, removed or reordered"
    for flag, was in before.items():
        assert now[flag] == was, flag


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_the_parsed_namespace_has_the_same_attributes_in_the_same_order(command: str) -> None:
    assert NOW[command]["namespace"] == BEFORE[command]["namespace"]


def metavar_once(text: str) -> str:
    """``text`` with each flag of a short and a long form as Python 3.13 writes it."""
    return _BOTH_FORMS.sub(r"\1\2, \4 \3", text)


def test_metavar_once_writes_both_forms_as_python_3_13_does() -> None:
    before = "  -h, --help     show this help\n  -n NAMESPACE, --namespace NAMESPACE\n    watch\n"
    now = "  -h, --help     show this help\n  -n, --namespace NAMESPACE\n    watch\n"
    assert metavar_once(before) == now
    assert metavar_once(now) == now
    # Another metavar on each form is another flag: left as it is.
    odd = "  -n NS, --namespace NAMESPACE\n"
    assert metavar_once(odd) == odd


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_help_prints_the_same_text(command: str) -> None:
    assert metavar_once(NOW[command]["help"]) == metavar_once(BEFORE[command]["help"])


def test_the_fixture_holds_every_flag_of_both_processes() -> None:
    """A fixture read wrong (or emptied) would let every comparison above pass."""
    flags = {f for a in BEFORE["serve"]["actions"] for f in a["option_strings"]}
    assert {"--state-ttl", "--limit-rounds", "--redis-password-file", "--keys"} <= flags
    assert len(BEFORE["serve"]["actions"]) > 40 and len(BEFORE["router"]["actions"]) > 25


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(observed(), indent=1) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
