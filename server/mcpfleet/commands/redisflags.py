"""The Redis flags shared by ``serve``, ``router`` and ``operator``, and the settings they give.

The flags name a URL and files; :mod:`mcpfleet.redisconn` checks them and
builds the clients. The operator's command (an entry-point plugin) imports
this module too: it is the one part of :mod:`mcpfleet.commands` it may use.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mcpfleet.redisconn import PASSWORD_FILE_FLAG, RedisSettings, Source, from_options


def add_flags(
    parser: argparse.ArgumentParser,
    *,
    url_help: str,
    required: bool = False,
    default: str | None = None,
    env_note: str = "",
) -> None:
    """The Redis flags shared by ``serve``, ``router`` and ``operator``."""
    parser.add_argument(
        "--redis",
        metavar="URL",
        required=required,
        default=default,
        help=f"{url_help}: redis://[user@]host:port/db, rediss://, unix:///path, "
        "redis+sentinel://host:port[,host:port]/master[/db], "
        "redis+cluster://host:port[,host:port], or @FILE holding the URL"
        f"{env_note}; no password here: use {PASSWORD_FILE_FLAG}",
    )
    parser.add_argument(
        PASSWORD_FILE_FLAG,
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the Redis password",
    )
    parser.add_argument(
        "--redis-ca-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="CA certificate(s) for rediss:// (PEM)",
    )
    parser.add_argument(
        "--redis-cert-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="client certificate for rediss:// (PEM)",
    )
    parser.add_argument(
        "--redis-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the client certificate's key (PEM)",
    )


def from_args(args: argparse.Namespace, *, source: Source = "argument") -> RedisSettings:
    """Settings from the parsed flags added by :func:`add_flags`."""
    return from_options(
        args.redis,
        password_file=args.redis_password_file,
        ca_file=args.redis_ca_file,
        cert_file=args.redis_cert_file,
        key_file=args.redis_key_file,
        source=source,
    )
