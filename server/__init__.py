"""mcpfleet's replica runtime, router and the contract shared with the operator.

Imported as ``mcpfleet.server``; the folder is mapped under the ``mcpfleet``
namespace so that nothing here shadows a standard-library module.

The public API for FastMCP authors is re-exported here: guard flows that ask
users for input on both protocol eras (:mod:`mcpfleet.server.guard`) and the
Prometheus middleware counting asking vs final rounds
(:mod:`mcpfleet.server.metrics`).
"""

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

__version__ = "0.1.0"

from mcpfleet.server.metrics import PrometheusMiddleware

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
