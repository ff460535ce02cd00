"""Every flag of every ``mcpfleet`` subcommand says what it does and, where it has
one, its default (``mcpfleet serve --help`` once showed bare ``--host``, ``--port``,
``--fleet``, ``--drain-timeout``, ...). The operator's subcommands come through the
same entry point and are held to the same rule."""

from __future__ import annotations

import argparse

import pytest

from mcpfleet.cli import HelpWithDefaults, build_parser

pytestmark = pytest.mark.unit


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"mcpfleet": parser, **sub.choices}


def test_the_operator_subcommands_are_there_to_be_checked() -> None:
    assert {"serve", "router", "keys", "dev", "demo", "selftest", "operator", "rotate"} <= set(
        _subparsers()
    )


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_flag_has_a_help_line_that_names_its_default(name: str) -> None:
    parser = _subparsers()[name]
    assert parser.formatter_class is HelpWithDefaults
    missing, no_default = [], []
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flag = "/".join(action.option_strings) or action.dest
        if not action.help:
            missing.append(flag)
            continue
        shown = formatter._expand_help(action)  # what --help prints for it
        meaningful = action.default not in (None, False, [], "", argparse.SUPPRESS)
        if action.option_strings and meaningful and "default" not in shown:
            no_default.append(flag)
    assert not missing, f"mcpfleet {name}: flags with no help line: {missing}"
    assert not no_default, f"mcpfleet {name}: help that does not name the default: {no_default}"


def test_a_flag_without_help_would_be_caught() -> None:
    parser = argparse.ArgumentParser(formatter_class=HelpWithDefaults)
    action = parser.add_argument("--bare", default=3)
    assert action.help is None
    shown = parser._get_formatter()._expand_help(action)
    assert shown == " (default: 3)"  # the default alone: the test above wants a help line too
