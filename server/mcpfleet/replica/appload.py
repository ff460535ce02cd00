"""Loading any FastMCP app by ``module:attribute`` and fitting it with the fleet's codec.

A FastMCP server installs ``mcp``'s ``RequestStateBoundary`` when it is
constructed, with whatever policy the app was built with (by default an
ephemeral per-process key, which no other replica could unseal). The fleet
replaces that boundary with one over the shared, reloadable key ring and one
audience for every replica, so a token sealed by one replica verifies on all.

FastMCP takes a request-state policy publicly only when a server is built
(``FastMCP(request_state_security=...)``); a loaded app is already built. So
:func:`install_codec` replaces the boundary in the low-level server's
middleware and the attribute FastMCP reads it from: private structure, which
is why it runs only on the FastMCP minor versions it is tested on
(:data:`TESTED_FASTMCP`) and refuses any other with a clear error rather than
serving with a policy that might not be the fleet's.

:func:`quiet_telemetry` turns FastMCP's and mcp's OpenTelemetry spans off
where nothing would record them (no OpenTelemetry SDK configured): the spans
cost every round CPU and reach no exporter.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

import fastmcp
from fastmcp import FastMCP
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from opentelemetry import trace

from mcpfleet.config import DEFAULT_APP, moved_app_module
from mcpfleet.keys.codec import ReloadableCodec

log = logging.getLogger("mcpfleet.replica")


class AppLoadError(Exception):
    """The ``--app`` value does not name a FastMCP server."""


def load_app(spec: str) -> FastMCP[Any]:
    """Import ``module:attribute`` and return the FastMCP server it names.

    A module that moved (:data:`mcpfleet.config.MOVED_APP_MODULES`: 0.1.0's
    ``mcpfleet.example``) is imported from where it is now, and one line says so.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must look like 'package.module:attribute', got {spec!r}")
    moved = moved_app_module(module_name)
    if moved is not None:
        log.warning(
            "--app %s: module %s moved to %s; serving %s:%s (give that name in --app,"
            " the chart's server.app)",
            spec,
            module_name,
            moved,
            moved,
            attr,
        )
        module_name = moved
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise AppLoadError(
            f"--app {spec!r}: cannot import module {exc.name!r}{_hint(exc)}"
        ) from None
    except Exception as exc:
        raise AppLoadError(
            f"--app {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppLoadError(
                f"--app {spec!r}: {module_name!r} has no attribute {attr!r}"
            ) from None
    if callable(obj) and not isinstance(obj, FastMCP):
        factory = obj
        try:
            obj = factory()  # a factory that builds the server
        except Exception as exc:
            raise AppLoadError(
                f"--app {spec!r} is not a FastMCP server, and calling it as a factory failed: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(obj, FastMCP):
        raise AppLoadError(f"--app {spec!r} is a {type(obj).__name__}, not a FastMCP server")
    return obj


def _hint(exc: ModuleNotFoundError) -> str:
    """What to install when the example apps' package is missing (not one of its modules)."""
    examples = DEFAULT_APP.partition(".")[0]
    if (exc.name or "").partition(".")[0] != examples or importlib.util.find_spec(examples):
        return ""
    return (
        " (the example apps are the distribution mcpfleet-examples, apart from mcpfleet:"
        " install it, `pip install ./server` in mcpfleet's repository, or give --app"
        " your own app)"
    )


#: FastMCP ``major.minor`` versions whose internals :func:`install_codec` is tested on.
TESTED_FASTMCP = ("4.1", "4.2")


def check_fastmcp_version(version: str | None = None) -> None:
    """Raise RuntimeError unless ``version`` (default: the installed fastmcp's) is one
    :func:`install_codec` is tested on."""
    version = version or fastmcp.__version__
    minor = ".".join(version.split(".")[:2])
    if minor not in TESTED_FASTMCP:
        raise RuntimeError(
            f"fastmcp {version} is not a version mcpfleet is tested on "
            f"({', '.join(v + '.x' for v in TESTED_FASTMCP)}): the fleet's request-state "
            "policy cannot be installed safely; install a tested fastmcp"
        )


def install_codec(
    app: FastMCP[Any], codec: ReloadableCodec, *, audience: str, ttl: float
) -> RequestStateSecurity:
    """Make ``app`` seal and unseal request state with ``codec`` under ``audience``."""
    check_fastmcp_version()
    security = RequestStateSecurity(codec=codec, audience=audience, ttl=ttl)
    lowlevel = app._mcp_server
    boundaries = [
        i for i, mw in enumerate(lowlevel.middleware) if isinstance(mw, RequestStateBoundary)
    ]
    if len(boundaries) != 1:
        raise RuntimeError(
            f"expected exactly one RequestStateBoundary in the app's middleware, found "
            f"{len(boundaries)}; this FastMCP version is not supported by mcpfleet"
        )
    lowlevel.middleware[boundaries[0]] = RequestStateBoundary(security, default_audience=audience)
    app._request_state_security = security
    log.info(
        "fastmcp %s (tested on %s): the fleet's request-state codec replaces the app's",
        fastmcp.__version__,
        ", ".join(v + ".x" for v in TESTED_FASTMCP),
    )
    return security


#: FastMCP's setting of its own spans; set in the environment, it is left as it is.
TELEMETRY_ENV = "FASTMCP_TELEMETRY_MODE"


def tracing_configured() -> bool:
    """Whether an OpenTelemetry SDK has a tracer provider set (by the app at import,
    or ``opentelemetry-instrument``): without one, every span is dropped unread."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def quiet_telemetry(environ: Mapping[str, str] | None = None) -> bool:
    """Turn off FastMCP's spans when nothing would record them; True if turned off.

    With no SDK configured the OpenTelemetry API hands out non-recording spans,
    but making them (attributes, trace context extracted from ``_meta``,
    context attached and detached) still costs every round CPU. So, unless an
    SDK is configured or ``FASTMCP_TELEMETRY_MODE`` is set, FastMCP's
    ``telemetry_mode`` (its documented setting, process-wide) becomes ``off``.
    FastMCP serves without mcp's own span middleware, so that setting covers
    every server span (tests/unit/test_appload.py checks both). An app that
    configures its SDK later than its import (in its lifespan) sets
    ``FASTMCP_TELEMETRY_MODE=native`` to keep the spans.
    """
    environ = os.environ if environ is None else environ
    if TELEMETRY_ENV in environ or tracing_configured():
        return False
    fastmcp.settings.telemetry_mode = "off"
    return True
