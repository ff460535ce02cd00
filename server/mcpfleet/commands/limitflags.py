"""The flags of the limits per principal (``mcpfleet serve`` and ``mcpfleet dev``).

They are declared in :data:`mcpfleet.config.LIMIT_SETTINGS`, within ``serve``'s
table; ``dev`` takes them too and passes those given to its replicas. A number
0 turns its limit off. The limits file (``--limits-file``, JSON,
mcpfleet.limits) sets the same and more (per tool, per principal) over them,
and is read again when it changes.
"""

from __future__ import annotations

import argparse
from typing import Any

from mcpfleet.commands import add_setting
from mcpfleet.config import LIMIT_SETTINGS


def add_flags(s: argparse.ArgumentParser, rep: Any) -> None:
    """The limit flags, their defaults from ``rep`` (ReplicaConfig); each dest is its field."""
    for setting in LIMIT_SETTINGS:
        add_setting(s, setting, setting.default_in(rep))
