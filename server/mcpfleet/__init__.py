"""mcpfleet's replica runtime, router and the contract shared with the operator.

Imported as ``mcpfleet.server``; the folder is mapped under the ``mcpfleet``
namespace so that nothing here shadows a standard-library module.

The public API for FastMCP authors is re-exported here: guard flows that ask
users for input on both protocol eras (:mod:`mcpfleet.server.guard`) and the
Prometheus middleware counting asking vs final rounds
(:mod:`mcpfleet.server.replica.middleware`). They are imported on first use, so that a
process needing only the contract (the operator, ``mcpfleet keys``) does not
load FastMCP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcpfleet.server.guard import (
        Answers,
        NextQuestion,
        Outcome,
        Question,
        ask,
        ask_then,
        first_missing,
        is_modern,
    )
    from mcpfleet.server.replica.middleware import PrometheusMiddleware

#: The installed distribution's version, read from its metadata on first use
#: (importlib.metadata costs an import a FastMCP author need not pay). It is
#: written once, in pyproject.toml, which the image's label
#: (hack/image/build.sh) reads too; the chart's appVersion must equal it
#: (tests/unit/test_version.py).
__version__: str

_EXPORTS = {
    "Answers": "mcpfleet.server.guard",
    "NextQuestion": "mcpfleet.server.guard",
    "Outcome": "mcpfleet.server.guard",
    "Question": "mcpfleet.server.guard",
    "ask": "mcpfleet.server.guard",
    "ask_then": "mcpfleet.server.guard",
    "first_missing": "mcpfleet.server.guard",
    "is_modern": "mcpfleet.server.guard",
    "PrometheusMiddleware": "mcpfleet.server.replica.middleware",
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
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib import metadata

        version = metadata.version("mcpfleet")
        globals()[name] = version
        return version
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mcpfleet.server' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
