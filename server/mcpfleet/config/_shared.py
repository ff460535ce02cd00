"""The flags both processes take, declared once.

A table names one as it is, or in its own words (:meth:`Setting.said`) where
its help line or chart value differ between ``serve`` and ``router``.
"""

from __future__ import annotations

from mcpfleet.config._settings import Setting
from mcpfleet.config._types import fleet_name, non_negative, port, positive

HOST = Setting("--host", "address to listen on")
PORT = Setting("--port", "port to listen on", port)
FLEET = Setting(
    "--fleet",
    "the fleet's name: its Redis keys' prefix, the same for every component",
    fleet_name,
)
REDIS_DEADLINE = Setting("--redis-deadline", "", positive)
REDIS_FAILOVER_WAIT = Setting("--redis-failover-wait", "", non_negative)
ALLOWED_HOST = Setting("--allowed-host", "", kind="repeat", field="allowed_hosts")
ALLOWED_ORIGIN = Setting("--allowed-origin", "", kind="repeat", field="allowed_origins")
