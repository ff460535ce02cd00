"""``mcpfleet``'s subcommands: one plugin protocol, and configs built from flags one way."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from mcpfleet import cli
from mcpfleet.commands import config_from_args
from mcpfleet.config import ReplicaConfig, RouterConfig

pytestmark = pytest.mark.unit

#: Flags that are not config fields: the Redis ones become redis_url and redis_files.
REDIS_DESTS = {
    "redis",
    "redis_password_file",
    "redis_ca_file",
    "redis_cert_file",
    "redis_key_file",
}


def subparser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("command", "config"), [("serve", ReplicaConfig), ("router", RouterConfig)]
)
def test_every_flag_of_serve_and_router_is_a_config_field(command: str, config: type) -> None:
    fields = {f.name for f in dataclasses.fields(config)}
    dests = {a.dest for a in subparser(command)._actions if a.dest != "help"}
    assert dests - REDIS_DESTS <= fields, "a flag no config field takes would be dropped"


def test_a_replica_config_from_flags_takes_every_value_given() -> None:
    args = cli.build_parser().parse_args(
        [
            "serve",
            "--keys",
            "/k",
            "--heartbeat",
            "3",
            "--allowed-host",
            "a",
            "--allowed-host",
            "b",
            "--once-memory-limit",
            "0.5",
            "--state-ttl",
            "60",
        ]
    )
    config = config_from_args(ReplicaConfig, args, redis_url=None)
    assert config.keys_dir == Path("/k") and config.heartbeat_interval == 3.0
    assert config.allowed_hosts == ("a", "b") and config.once_memory_limit == 0.5
    assert config.state_ttl == 60.0 and config.redis_url is None
    assert config.drain_timeout == ReplicaConfig.drain_timeout  # untouched: the default


def test_a_router_config_from_flags_takes_every_value_given() -> None:
    args = cli.build_parser().parse_args(
        [
            "router",
            "--redis",
            "redis://127.0.0.1:1/0",
            "--allowed-origin",
            "x",
            "--session-cap",
            "4",
        ]
    )
    config = config_from_args(RouterConfig, args, redis_url=args.redis)
    assert config.allowed_origins == ("x",) and config.session_cap == 4
    assert config.redis_url == "redis://127.0.0.1:1/0"
    assert config.refresh_interval == RouterConfig.refresh_interval  # no flag: the default


def test_every_subcommand_comes_from_one_plugin_protocol() -> None:
    plugins = cli.command_plugins()
    names = [name for plugin in plugins for name in plugin.COMMANDS]
    assert names[:6] == ["serve", "router", "keys", "dev", "demo", "selftest"]
    assert {"operator", "rotate"} <= set(names)
    assert len(names) == len(set(names)), "two modules claim one subcommand"
    for plugin in plugins:
        assert callable(plugin.add_parsers) and callable(plugin.run)


def test_a_pool_wait_past_the_deadline_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["router", "--redis", "redis://127.0.0.1:1/0", "--redis-pool-wait", "3"]
    assert cli.main(argv) == 2
    assert "--redis-pool-wait (3) must be below --redis-deadline (2)" in capsys.readouterr().err


def test_the_sse_flags_reach_the_config_and_refuse_what_cannot_bound_a_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mcpfleet.notify import EVENT_TTL, EVENTS_PER_STREAM

    assert (ReplicaConfig.sse_events, ReplicaConfig.sse_ttl) == (EVENTS_PER_STREAM, EVENT_TTL)
    args = cli.build_parser().parse_args(
        ["serve", "--keys", "/k", "--sse-events", "0", "--sse-ttl", "30"]
    )
    config = config_from_args(ReplicaConfig, args, redis_url=None)
    assert (config.sse_events, config.sse_ttl) == (0, 30.0)
    for bad in (["--sse-events", "-1"], ["--sse-events", "many"], ["--sse-ttl", "0"]):
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args(["serve", "--keys", "/k", *bad])
        assert exited.value.code == 2
        assert bad[0] in capsys.readouterr().err
