"""Loading an app and fitting it with the fleet's codec, on tested FastMCP versions only."""

from __future__ import annotations

from typing import Any

import fastmcp
import pytest
from fastmcp import Client, Context, FastMCP
from mcp.server.request_state import RequestStateBoundary
from mcp_types import InputRequiredResult

from mcpfleet import Question, ask_then, first_missing
from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.keys.ring import KeyRing
from mcpfleet.replica.appload import (
    TELEMETRY_ENV,
    TESTED_FASTMCP,
    check_fastmcp_version,
    install_codec,
    quiet_telemetry,
)


def _app() -> FastMCP[Any]:
    app = FastMCP("appload-test")

    @app.tool
    async def ok(ctx: Context) -> str | InputRequiredResult:
        return await ask_then(
            ctx, first_missing([Question("ok", "ok?", bool)]), lambda o: str(o.answers["ok"])
        )

    return app


def test_the_installed_fastmcp_is_a_tested_one() -> None:
    check_fastmcp_version()
    assert ".".join(fastmcp.__version__.split(".")[:2]) in TESTED_FASTMCP


@pytest.mark.parametrize("version", ["4.3.0", "5.0.0", "4.0.11"])
def test_untested_fastmcp_versions_are_refused_loudly(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastmcp, "__version__", version)
    with pytest.raises(RuntimeError, match=f"fastmcp {version} is not a version mcpfleet"):
        install_codec(_app(), ReloadableCodec(KeyRing.generate()), audience="a", ttl=60)


async def test_install_codec_replaces_the_one_boundary_and_the_app_seals_with_the_ring() -> None:
    app = _app()
    ring = KeyRing.generate()
    seen: list[tuple[str, str]] = []
    codec = ReloadableCodec(ring, observer=lambda event, detail: seen.append((event, detail)))
    security = install_codec(app, codec, audience="fleet/test", ttl=60)
    boundaries = [m for m in app._mcp_server.middleware if isinstance(m, RequestStateBoundary)]
    assert len(boundaries) == 1
    assert app._request_state_security is security

    async def yes(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return response_type(value=True)

    async with Client(app, mode="auto", elicitation_handler=yes) as client:
        result = await client.call_tool("ok", {})
    assert str(result.data) == "True"
    assert ("unseal", ring.kids[0]) in seen, "the continuation was unsealed with the ring's key"


def test_fastmcp_serves_without_mcps_span_middleware() -> None:
    """FastMCP replaces mcp's ``OpenTelemetryMiddleware`` (a private module) with its
    own, which ``telemetry_mode`` governs: so that one setting turns every server
    span off. If a FastMCP version serves with mcp's again, this fails."""
    from mcp.server._otel import OpenTelemetryMiddleware

    middleware = _app()._mcp_server.middleware
    assert not any(isinstance(mw, OpenTelemetryMiddleware) for mw in middleware)


def test_spans_are_turned_off_when_no_opentelemetry_sdk_would_record_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fastmcp.settings, "telemetry_mode", "native")
    assert quiet_telemetry(environ={})
    assert fastmcp.settings.telemetry_mode == "off"


@pytest.mark.parametrize("why", ["environment", "sdk"])
def test_spans_stay_on_when_an_sdk_is_configured_or_the_mode_was_chosen(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    from opentelemetry import trace

    monkeypatch.setattr(fastmcp.settings, "telemetry_mode", "native")
    environ = {TELEMETRY_ENV: "native"} if why == "environment" else {}
    if why == "sdk":
        monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.NoOpTracerProvider())
    assert not quiet_telemetry(environ=environ)
    assert fastmcp.settings.telemetry_mode == "native"
