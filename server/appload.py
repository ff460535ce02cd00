"""Loading any FastMCP app by ``module:attribute`` and fitting it with the fleet's codec.

A FastMCP server installs ``mcp``'s ``RequestStateBoundary`` when it is
constructed, with whatever policy the app was built with (by default an
ephemeral per-process key, which no other replica could unseal). The fleet
replaces that boundary with one over the shared, reloadable key ring and one
audience for every replica, so a token sealed by one replica verifies on all.
"""

from __future__ import annotations

import importlib
from typing import Any

from fastmcp import FastMCP
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

from mcpfleet.server.codec import ReloadableCodec

DEFAULT_APP = "mcpfleet.server.example.app:app"


class AppLoadError(Exception):
    """The ``--app`` value does not name a FastMCP server."""


def load_app(spec: str) -> FastMCP[Any]:
    """Import ``module:attribute`` and return the FastMCP server it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must look like 'package.module:attribute', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise AppLoadError(f"--app {spec!r}: cannot import module {exc.name!r}") from None
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


def install_codec(
    app: FastMCP[Any], codec: ReloadableCodec, *, audience: str, ttl: float
) -> RequestStateSecurity:
    """Make ``app`` seal and unseal request state with ``codec`` under ``audience``."""
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
    return security
