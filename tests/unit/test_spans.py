"""FastMCP's span helpers skipped while its telemetry_mode is off (mcpfleet.replica.spans).

The helpers are looked up by FastMCP at each call, so these tests drive a real
FastMCP app and count what FastMCP's own attribute builders are asked for.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import fastmcp
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server import telemetry
from opentelemetry.trace import INVALID_SPAN

from mcpfleet.replica.spans import HELPERS, skip_span_helpers, span_helpers_skipped

pytestmark = pytest.mark.unit


@pytest.fixture
def helpers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """FastMCP's helpers put back after the test; the attribute builders counted."""
    for mod, name in HELPERS:
        monkeypatch.setattr(importlib.import_module(mod), name, getattr(telemetry, name))
    built: list[str] = []
    original = telemetry.get_protocol_span_attributes

    def counted() -> dict[str, str]:
        built.append("span attributes")
        return original()

    monkeypatch.setattr(telemetry, "get_protocol_span_attributes", counted)
    return built


def _app() -> FastMCP[Any]:
    app = FastMCP("spans")

    @app.tool
    def add(a: int, b: int) -> int:
        return a + b

    return app


async def _call(app: FastMCP[Any]) -> Any:
    async with Client(app) as client:
        return (await client.call_tool("add", {"a": 2, "b": 3})).data


async def test_with_the_spans_off_a_call_builds_no_span_attributes_and_answers_the_same(
    helpers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastmcp.settings, "telemetry_mode", "off")
    assert await _call(_app()) == 5
    assert helpers, "FastMCP no longer builds span attributes with its spans off"
    helpers.clear()
    assert skip_span_helpers()
    assert span_helpers_skipped()
    assert await _call(_app()) == 5
    assert helpers == []


async def test_with_the_spans_on_fastmcps_helpers_run_as_before(
    helpers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert skip_span_helpers()
    monkeypatch.setattr(fastmcp.settings, "telemetry_mode", "native")
    assert await _call(_app()) == 5
    assert helpers  # FastMCP's own helpers ran


def test_the_pass_through_yields_the_invalid_span_and_lets_errors_through(
    helpers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert skip_span_helpers()
    monkeypatch.setattr(fastmcp.settings, "telemetry_mode", "off")
    server_span = importlib.import_module("fastmcp.server.server").server_span
    with server_span("tools/call add", "tools/call", "spans", "tool", "add") as span:
        assert span is INVALID_SPAN
    with pytest.raises(KeyError), server_span("t", "tools/call", "spans", "tool", "t"):
        raise KeyError("raised inside the span")
    assert helpers == []


def test_twice_is_once_and_a_name_that_is_not_fastmcps_helper_is_left_alone(
    helpers: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert skip_span_helpers()
    wrapped = importlib.import_module("fastmcp.server.server").server_span
    assert skip_span_helpers()
    assert importlib.import_module("fastmcp.server.server").server_span is wrapped

    low_level = importlib.import_module("fastmcp.server.low_level")
    someone_elses = object()
    monkeypatch.setattr(low_level, "seam_span", someone_elses)
    with caplog.at_level(logging.WARNING, logger="mcpfleet.replica"):
        assert not skip_span_helpers()
    assert low_level.seam_span is someone_elses
    assert "is not FastMCP's span helper" in caplog.text
    assert not span_helpers_skipped()
