"""One source of defaults: the command line's come from the config dataclasses."""

from __future__ import annotations

import dataclasses

import pytest

from mcpfleet.cli import build_parser
from mcpfleet.config import ReplicaConfig, RouterConfig

#: Flags whose name differs from the config field they set.
RENAMED = {"heartbeat": "heartbeat_interval", "redis": "redis_url", "keys": "keys_dir"}


@pytest.mark.parametrize(
    ("argv", "config"),
    [
        (["serve", "--keys", "/k"], ReplicaConfig),
        (["router", "--redis", "redis://127.0.0.1:6379/0"], RouterConfig),
    ],
)
def test_every_flag_default_is_the_configs(argv: list[str], config: type) -> None:
    args = vars(build_parser().parse_args(argv))
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    compared = 0
    for dest, value in args.items():
        field = RENAMED.get(dest, dest)
        if field in defaults and defaults[field] is not dataclasses.MISSING and value != []:
            assert value == defaults[field], f"--{dest.replace('_', '-')}"
            compared += 1
    assert compared >= 8


def test_a_replicas_session_idle_time_is_the_routers_session_ttl() -> None:
    assert ReplicaConfig.session_idle == RouterConfig.session_ttl
    args = build_parser().parse_args(["serve", "--keys", "/k", "--session-idle", "60"])
    assert args.session_idle == 60.0
