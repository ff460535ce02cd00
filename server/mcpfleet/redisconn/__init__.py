"""How every mcpfleet component connects to Redis: URLs, secrets from files, TLS, Sentinel.

The replica, the router and the operator accept the same things and build
their clients here, nowhere else:

* a URL: ``redis://``, ``rediss://`` (TLS), ``unix://`` or
  ``redis+sentinel://[[user]:password@]host:port[,host:port...]/<master>[/<db>]``
  (``rediss+sentinel://`` for Sentinel with TLS),
  ``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+cluster://``:
  a Redis Cluster, the hosts its seed nodes; :func:`on_cluster`); a user name may be in it
  (``redis://replica@redis:6379/0``: an ACL user);
* the password from a file (``--redis-password-file``), re-read at every new
  connection, so a rotated Secret needs no restart;
* TLS files: the CA that signed the server's certificate, and optionally a
  client certificate and its key.

Secrets never travel in process arguments or environment variables: a URL
given on the command line (or in ``$MCPFLEET_REDIS_URL``) that carries a
password is refused, with a pointer to the password file flag. A URL read
from a file (``--redis @FILE``) may carry one. Only :func:`redact_url`
output is ever logged; file contents never are.

For Sentinel, the credentials in the URL (or the password file) are the
master's; the sentinels are asked without credentials, over TLS when the
URL is ``rediss+sentinel://``. redis-py's Sentinel pools ask the sentinels for the
master at every new connection and drop connections to a demoted one, which
is all following a failover takes: the components' usual Redis-down path
(retry, degrade, write back) covers the seconds in between, and a step that
must not fail during a failover (a once-flow's claim) waits for the new
master with :func:`ride_through`.

Fail fast, bounded: every client is built with at most :data:`RETRIES` retry,
on a connection error only, with no backoff (redis-py's default retries ten
times with a growing backoff, which turned a 0.5 s socket timeout into 10-18 s
waits); a timeout is never retried (the command may have run). A request's
path also puts a deadline around each Redis step (:func:`within`), so the
wait is bounded whatever the client does inside it.

The package, from the bottom up (each module imports only those before it):
``_urls`` parses and redacts URLs; ``_settings`` reads the secret files,
checks the TLS files and holds the settings and the retry policy a client is
built with; ``_clients`` builds the clients (Sentinel included) and bounds
every wait (:func:`within`, :func:`ride_through`, :func:`pool_full`);
``_version`` checks the server's version at start (:func:`check_version`);
``_direct`` is the once ledger's command driver (:class:`DirectCommands`),
used only on the redis-py versions it is tested with. Every name is imported
from here. The command-line flags that build settings are
:mod:`mcpfleet.commands.redisflags`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcpfleet.redisconn._clients import (
    DEFAULT_DEADLINE,
    DEFAULT_FAILOVER_WAIT,
    FAILOVER_PAUSE,
    POOL_SIZE,
    POOL_WAIT,
    async_client,
    describe,
    follow_master,
    mget_by_slot,
    on_cluster,
    pool_full,
    queue_target,
    ride_through,
    sync_client,
    through_sentinel,
    within,
)
from mcpfleet.redisconn._direct import TESTED_REDIS_PY, DirectCommands, direct_driver_problem
from mcpfleet.redisconn._settings import (
    PASSWORD_FILE_FLAG,
    RETRIES,
    FilePassword,
    RedisFiles,
    RedisSettings,
    Source,
    fail_fast_retry,
    from_options,
    read_secret_file,
    read_url_argument,
    settings,
)
from mcpfleet.redisconn._urls import (
    DEFAULT_PORT,
    DEFAULT_SENTINEL_PORT,
    SCHEMES,
    RedisConfigError,
    RedisURL,
    parse_url,
    redact_url,
)
from mcpfleet.redisconn._version import MIN_VERSION, RedisTooOld, check_version, version_error

__all__: Sequence[str] = (
    "DEFAULT_DEADLINE",
    "DEFAULT_FAILOVER_WAIT",
    "DEFAULT_PORT",
    "DEFAULT_SENTINEL_PORT",
    "FAILOVER_PAUSE",
    "MIN_VERSION",
    "PASSWORD_FILE_FLAG",
    "POOL_SIZE",
    "POOL_WAIT",
    "RETRIES",
    "SCHEMES",
    "TESTED_REDIS_PY",
    "DirectCommands",
    "FilePassword",
    "RedisConfigError",
    "RedisFiles",
    "RedisSettings",
    "RedisTooOld",
    "RedisURL",
    "Source",
    "async_client",
    "check_version",
    "describe",
    "direct_driver_problem",
    "fail_fast_retry",
    "follow_master",
    "from_options",
    "mget_by_slot",
    "on_cluster",
    "parse_url",
    "pool_full",
    "queue_target",
    "read_secret_file",
    "read_url_argument",
    "redact_url",
    "ride_through",
    "settings",
    "sync_client",
    "through_sentinel",
    "version_error",
    "within",
)
