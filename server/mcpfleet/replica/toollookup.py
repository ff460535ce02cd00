"""FastMCP's tool lookup without a task group when the server has one local provider.

A FastMCP server is an aggregate of its providers, and it looks a tool up in
all of them at once (``AggregateProvider._get_tool``: FastMCP's ``gather``, an
anyio task group and a task per provider), on every ``tools/call``. An app that registers
its own tools and mounts nothing has one provider, its ``LocalProvider``, and
each lookup is a dictionary read: the task group and the task around it cost
about 7 % of a modern round's instructions (callgrind, with and without, as
docs/performance.md measures the replica in one process).

:func:`skip_lookup_tasks` puts a fast path in front of that method, for every
aggregate in the process. With exactly one provider, a ``LocalProvider`` (or
FastMCP's own subclass of it), it awaits that provider's lookup in the caller's
task and hands the outcome to FastMCP's ``_get_highest_version_result``, as
the aggregate does with its one result. Any other aggregate (a mounted server,
a proxy, a custom provider, two providers) takes FastMCP's way.

What differs, and why no caller sees it (``tests/unit/test_toollookup.py``):

* the lookup runs in the caller's task, not in a child task with a copy of its
  context: a ``LocalProvider``'s lookup resets every context variable it sets;
* an ``Exception`` of the lookup is handed on as a result, as FastMCP's
  ``gather(..., return_exceptions=True)`` hands it (a ``NotFoundError`` is no
  tool; another is raised or logged by the aggregate's error strategy); a
  cancellation is raised, as the aggregate's task group raises the caller's.

This is private structure, so it runs only on the FastMCP versions the replica is
tested on (:data:`mcpfleet.replica.appload.TESTED_FASTMCP`, which the replica
checks before it serves), and only while the method is still FastMCP's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastmcp.server.providers.aggregate import AggregateProvider
from fastmcp.server.providers.local_provider import LocalProvider

from mcpfleet.replica.infront import in_front, put_in_front

__all__ = ["lookup_tasks_skipped", "skip_lookup_tasks"]


def _local_types() -> tuple[type[Any], ...]:
    """``LocalProvider`` and FastMCP's own subclass of it (exact types only: a
    subclass of an app's may do anything in its lookup)."""
    from fastmcp.server import server

    own = getattr(server, "_SchemaCacheLocalProvider", None)
    return (LocalProvider,) if own is None else (LocalProvider, own)


def _fast(original: Callable[..., Any]) -> Callable[..., Any]:
    local = _local_types()

    async def _get_tool(self: AggregateProvider, name: str, version: Any = None) -> Any:
        providers = self.providers
        if len(providers) != 1 or type(providers[0]) not in local:
            return await original(self, name, version)
        try:
            found: Any = await providers[0].get_tool(name, version)
        except Exception as exc:  # as gather(return_exceptions=True) hands it on
            found = exc
        return self._get_highest_version_result([found], f"get_tool({name!r})")

    return _get_tool


def lookup_tasks_skipped() -> bool:
    """Whether the fast path is in front of ``AggregateProvider._get_tool``."""
    return in_front(AggregateProvider, "_get_tool")


def skip_lookup_tasks() -> bool:
    """Put the fast path in front of FastMCP's tool lookup; True if it is there.

    Idempotent. A method that is not FastMCP's own any more (another FastMCP, or
    something else replaced it) is left alone, and one line says so.
    """
    return put_in_front(
        AggregateProvider,
        "_get_tool",
        _fast,
        "each tool lookup still makes a task group",
        needs=("_get_highest_version_result",),
    )
