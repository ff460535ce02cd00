"""``mcpfleet dev`` takes the replicas' limit flags, as ``serve`` declares them, and
hands the ones given to every replica (and to the embedded one)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from mcpfleet import cli
from mcpfleet.commands import config_from_args, dev, limitflags
from mcpfleet.config import ReplicaConfig

pytestmark = pytest.mark.unit


def _dev(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["dev", *argv])


def test_dev_takes_every_limit_flag_serve_takes() -> None:
    declared = {flag for action in dev.limit_flags() for flag in action.option_strings}
    assert {"--limit-rounds", "--limit-burst", "--limit-sessions", "--limits-file"} <= declared
    serve = cli.build_parser().parse_args(["serve", "--keys", "/k"])
    for action in dev.limit_flags():
        assert hasattr(serve, action.dest), f"{action.option_strings} is not serve's"
    for action in dev.limit_flags():
        value = action.choices[0] if action.choices else "1"  # type: ignore[index]
        given = _dev(action.option_strings[-1], str(value))
        assert getattr(given, action.dest) is not None


def test_no_limit_flag_given_passes_none_and_the_replicas_keep_their_defaults() -> None:
    assert dev.limit_args(_dev()) == []
    assert dev.limit_fields(_dev()) == {}


def test_the_limit_flags_given_reach_each_replicas_serve_command_line() -> None:
    args = _dev("--limit-rounds", "500", "--limit-burst", "1000", "--limits-file", "l.json")
    passed = dev.limit_args(args)
    assert passed == ["--limit-rounds=500.0", "--limit-burst=1000", "--limits-file=l.json"]
    # What a replica's serve makes of them: the values given.
    serve = cli.build_parser().parse_args(["serve", "--keys", "/k", *passed])
    config = config_from_args(ReplicaConfig, serve, redis_url=None)
    assert (config.limit_rounds, config.limit_burst) == (500.0, 1000)
    assert config.limits_file == Path("l.json")
    assert config.limit_sessions == ReplicaConfig.limit_sessions


def test_a_trusted_hops_given_replaces_the_fleets_own_one_hop() -> None:
    """The fleet passes --trusted-hops 1 (the router) first; a given value comes last."""
    given = dev.limit_args(_dev("--trusted-hops", "2"))
    serve = cli.build_parser().parse_args(["serve", "--keys", "/k", "--trusted-hops", "1", *given])
    assert serve.trusted_hops == 2


def test_the_embedded_replica_gets_the_limit_fields() -> None:
    fields = dev.limit_fields(_dev("--limit-sessions", "7", "--anonymous-principal", "shared"))
    assert fields == {"limit_sessions": 7, "anonymous_principal": "shared"}
    config = ReplicaConfig(keys_dir=Path("/k"), **fields)
    assert config.limit_sessions == 7


def test_a_limit_flag_declared_later_passes_through_with_no_change_to_dev(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dev passes the declared set, not a list of its own: a new flag (here a made-up
    initialize rate and a switch) reaches the replicas by itself."""
    declare = limitflags.add_flags

    def with_more(s: argparse.ArgumentParser, rep: Any) -> None:
        declare(s, rep)
        s.add_argument("--limit-initialize", type=float, default=5.0, help="(default 5)")
        s.add_argument("--limit-strict", action="store_true", help="a switch")

    monkeypatch.setattr(limitflags, "add_flags", with_more)
    args = _dev("--limit-initialize", "2.5", "--limit-strict")
    assert dev.limit_args(args) == ["--limit-initialize=2.5", "--limit-strict"]
    assert dev.limit_args(_dev()) == []
