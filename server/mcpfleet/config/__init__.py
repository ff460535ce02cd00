"""The settings of a replica and of a router: the one source of their defaults and flags.

Plain dataclasses with no I/O and no heavy imports, so a deployment reads one
place to see what a value means. Values that two components must agree on say
so: a replica's session idle time is the router's session TTL.

Below them, :data:`SETTINGS`: one table per process (``serve``, ``router``) of
its flags, in ``--help``'s order: each flag's name, how its value is read (the
argparse types here), its help line, the environment variable the process falls
back to, and the chart value that sets it. A flag's default is its config
field's; a flag both processes take (``--host``, ``--fleet``,
``--redis-deadline``, ...) is declared once and named in both tables.
:mod:`mcpfleet.commands` makes the parsers from the tables; the tests hold the
docs' stated defaults and the chart's values to them. The Redis flags
(:mod:`mcpfleet.commands.redisflags`) are declared there, once for ``serve``,
``router`` and the operator, which may not import this package; a table marks
where they go with :class:`RedisFlags`.

Everything is imported from here; the private modules behind it each hold one
part: ``_configs`` the dataclasses, ``_types`` how a flag's value is read,
``_settings`` what a table is made of, ``_shared`` the flags both processes
take, ``_limits`` the limits per principal, ``_replica`` and ``_router`` each
process's table.
"""

from __future__ import annotations

from mcpfleet.config._configs import (
    DEFAULT_APP,
    MOVED_APP_MODULES,
    POD_IP_ENV,
    POD_NAME_ENV,
    SESSION_IDLE,
    ReplicaConfig,
    RouterConfig,
    first_app_name,
    moved_app_module,
)
from mcpfleet.config._limits import LIMIT_SETTINGS
from mcpfleet.config._replica import REPLICA_FLAGS
from mcpfleet.config._router import ROUTER_FLAGS
from mcpfleet.config._settings import FROM_CONFIG, Flags, RedisFlags, Setting
from mcpfleet.config._shared import (
    ALLOWED_HOST,
    ALLOWED_ORIGIN,
    FLEET,
    HOST,
    PORT,
    REDIS_DEADLINE,
    REDIS_FAILOVER_WAIT,
)
from mcpfleet.config._types import (
    fleet_name,
    non_negative,
    non_negative_int,
    port,
    positive,
    positive_int,
    share,
)

__all__ = [
    "ALLOWED_HOST",
    "ALLOWED_ORIGIN",
    "DEFAULT_APP",
    "FLEET",
    "FROM_CONFIG",
    "HOST",
    "LIMIT_SETTINGS",
    "MOVED_APP_MODULES",
    "POD_IP_ENV",
    "POD_NAME_ENV",
    "PORT",
    "REDIS_DEADLINE",
    "REDIS_FAILOVER_WAIT",
    "REPLICA_FLAGS",
    "ROUTER_FLAGS",
    "SESSION_IDLE",
    "SETTINGS",
    "Flags",
    "RedisFlags",
    "ReplicaConfig",
    "RouterConfig",
    "Setting",
    "first_app_name",
    "fleet_name",
    "moved_app_module",
    "non_negative",
    "non_negative_int",
    "port",
    "positive",
    "positive_int",
    "share",
]

#: Each process's flags, by its command.
SETTINGS: dict[str, Flags] = {"serve": REPLICA_FLAGS, "router": ROUTER_FLAGS}
