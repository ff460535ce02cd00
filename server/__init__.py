"""mcpfleet's replica runtime, router and the contract shared with the operator.

Imported as ``mcpfleet.server``; the folder is mapped under the ``mcpfleet``
namespace so that nothing here shadows a standard-library module.
"""

__version__ = "0.1.0"

from mcpfleet.server.metrics import PrometheusMiddleware

__all__ = ["PrometheusMiddleware", "__version__"]
