"""mcpfleet's replica runtime, router and the contract shared with the operator.

The package lives in the source root ``server/`` (``server/mcpfleet/``); the
operator is the separate package ``mcpfleet_operator`` in ``operator/``.
Only what ``__all__`` names is API; every other module is internal.

The public API for FastMCP authors is re-exported here: guard flows that ask
users for input on both protocol eras (:mod:`mcpfleet.guard`), the
Prometheus middleware counting asking vs final rounds
(:mod:`mcpfleet.replica.middleware`), and events published to the fleet's
``subscriptions/listen`` streams from any code (:mod:`mcpfleet.notify`). They
are imported on first use, so that a process needing only the contract (the
operator, ``mcpfleet keys``) does not load FastMCP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcpfleet.guard import (
        Answers,
        NextQuestion,
        Outcome,
        Question,
        ask,
        ask_then,
        first_missing,
        is_modern,
    )
    from mcpfleet.notify import publish_list_changed, publish_resource_updated
    from mcpfleet.replica.middleware import PrometheusMiddleware

#: The installed distribution's version, read from its metadata on first use
#: (importlib.metadata costs an import a FastMCP author need not pay). It is
#: written once, in pyproject.toml, which the image's label
#: (hack/image/build.sh) reads too; the chart's appVersion must equal it
#: (tests/unit/test_version.py).
__version__: str

_EXPORTS = {
    "Answers": "mcpfleet.guard",
    "NextQuestion": "mcpfleet.guard",
    "Outcome": "mcpfleet.guard",
    "Question": "mcpfleet.guard",
    "ask": "mcpfleet.guard",
    "ask_then": "mcpfleet.guard",
    "first_missing": "mcpfleet.guard",
    "is_modern": "mcpfleet.guard",
    "PrometheusMiddleware": "mcpfleet.replica.middleware",
    "publish_list_changed": "mcpfleet.notify",
    "publish_resource_updated": "mcpfleet.notify",
}

__all__ = [
    "Answers",
    "NextQuestion",
    "Outcome",
    "PrometheusMiddleware",
    "Question",
    "__version__",
    "ask",
    "ask_then",
    "first_missing",
    "is_modern",
    "publish_list_changed",
    "publish_resource_updated",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib import metadata

        version = metadata.version("mcpfleet")
        globals()[name] = version
        return version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mcpfleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
