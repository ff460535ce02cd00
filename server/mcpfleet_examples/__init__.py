"""The example apps: FastMCP servers written as their authors write them, beside the product.

``app`` is the example app of guard tools that ``mcpfleet serve`` and ``mcpfleet
dev`` run by default (``--app mcpfleet_examples.app:app``, the chart's
``server.app``); ``conformance`` is the app the official MCP conformance suite
runs against; ``tasks`` an app with MCP tasks (the ``[tasks]`` extra). Each
imports only ``mcpfleet``'s public API (``from mcpfleet import ...``).

They are a distribution of their own, ``mcpfleet-examples``
(``server/pyproject.toml``), not part of the ``mcpfleet`` wheel: the image and
the development venv install both. 0.1.0 shipped them inside ``mcpfleet`` as
``mcpfleet.example``; an ``--app`` under that name still loads from here
(:data:`mcpfleet.config.MOVED_APP_MODULES`).
"""
