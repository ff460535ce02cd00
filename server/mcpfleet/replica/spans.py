"""FastMCP's span helpers made free while its ``telemetry_mode`` is ``off``.

:func:`mcpfleet.replica.appload.quiet_telemetry` turns FastMCP's spans off when no
OpenTelemetry SDK would record them. FastMCP then makes no span, but its two
per-request helpers, ``seam_span`` (every request, in the low-level server) and
``server_span`` (every tool, prompt and resource call), still build each span's
attributes first: the protocol version, the access token's subject and scopes,
and ``Context.session_id``, which on a 2026-07-28 request makes a new
``uuid4`` every time. Then they hand them to a tracer that drops them. That is
about 4 % of a modern round's CPU (``make bench BENCH_ARGS=--rounds-only``).

:func:`skip_span_helpers` puts a pass-through in front of each of the two names
where FastMCP looks them up (``fastmcp.server.low_level.seam_span`` and
``fastmcp.server.server.server_span``, module globals read at each call). While
the mode is ``off`` it yields the invalid span FastMCP's own disabled tracer
yields, and touches no context. In any other mode it calls FastMCP's helper, so
a process that turns the spans on again gets them whole. With the mode ``off``,
FastMCP's helpers set only their own context variables and read nothing else,
so nothing a request sees changes (``tests/unit/test_spans.py``).

This is private structure, so it runs only on the FastMCP versions the replica is
tested on (:data:`mcpfleet.replica.appload.TESTED_FASTMCP`, which the replica
checks before it serves), and only where each name is still FastMCP's own helper.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

import fastmcp
from opentelemetry.trace import INVALID_SPAN, Span

__all__ = ["HELPERS", "skip_span_helpers", "span_helpers_skipped"]

log = logging.getLogger("mcpfleet.replica")

#: Where FastMCP looks each helper up at every call: (module, name).
HELPERS: Final = (
    ("fastmcp.server.low_level", "seam_span"),
    ("fastmcp.server.server", "server_span"),
)


class _NoSpan:
    """A context manager that yields the invalid span and lets every exception through."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


def _unless_off(helper: Callable[..., Any]) -> Callable[..., Any]:
    settings = fastmcp.settings

    def pass_through(*args: Any, **kwargs: Any) -> Any:
        if settings.telemetry_mode == "off":
            return _NO_SPAN
        return helper(*args, **kwargs)

    pass_through.__wrapped__ = helper  # type: ignore[attr-defined]
    pass_through.__name__ = getattr(helper, "__name__", "span_helper")
    return pass_through


def span_helpers_skipped() -> bool:
    """Whether every helper of :data:`HELPERS` is the pass-through."""
    return all(
        hasattr(getattr(importlib.import_module(mod), name), "__wrapped__") for mod, name in HELPERS
    )


def skip_span_helpers() -> bool:
    """Put the pass-through in front of FastMCP's span helpers; True if both are.

    Idempotent. A name that is no longer FastMCP's own helper (another FastMCP,
    or something else replaced it) is left alone, and one line says so.
    """
    from fastmcp.server import telemetry

    done = 0
    for mod, name in HELPERS:
        module = importlib.import_module(mod)
        current = getattr(module, name, None)
        fastmcps = getattr(telemetry, name, None)
        if fastmcps is not None and current is fastmcps:
            setattr(module, name, _unless_off(current))
            done += 1
        elif fastmcps is not None and getattr(current, "__wrapped__", None) is fastmcps:
            done += 1  # already in front of it
        else:
            log.warning(
                "fastmcp %s: %s.%s is not FastMCP's span helper; its span attributes "
                "are still built with the spans off",
                fastmcp.__version__,
                mod,
                name,
            )
    return done == len(HELPERS)
