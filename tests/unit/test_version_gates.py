"""Each version gate says once, at start-up, which path it took (issue: drift caught early).

A gate runs code of mcpfleet's on a dependency's internals only on the versions
it was tested on: FastMCP's request-state boundary (the codec), mcp's streamable
HTTP transport (handshake sessions primed and resumed), FastMCP's tasks engine
(its hooks) and redis-py's connections (the once ledger's direct commands, in
tests/unit/test_redisconn_direct.py). An operator reading a replica's start-up
log learns which path each took, and on what version.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

import fastmcp
import pytest
from fastmcp import FastMCP

from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.keys.ring import KeyRing
from mcpfleet.replica.appload import install_codec
from mcpfleet.replica.runtime import prime_sessions

pytestmark = pytest.mark.unit


def _messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_the_codec_gate_logs_the_fastmcp_it_installed_the_codec_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="mcpfleet.replica"):
        install_codec(FastMCP("gate"), ReloadableCodec(KeyRing.generate()), audience="a", ttl=60)
    (said,) = _messages(caplog, "mcpfleet.replica")
    assert said.startswith(f"fastmcp {fastmcp.__version__} (tested on ")
    assert "request-state codec replaces the app's" in said


async def test_the_transport_gate_logs_that_mcps_transport_was_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    http_app = FastMCP("gate").http_app(path="/mcp")
    async with http_app.router.lifespan_context(http_app):
        with caplog.at_level(logging.INFO):
            assert prime_sessions(http_app)
    (said,) = _messages(caplog, "mcpfleet.replica")
    assert said.startswith(f"sse: mcp {importlib.metadata.version('mcp')}: ")
    assert "get mcpfleet's transport" in said
    assert not _messages(caplog, "mcpfleet.notify")


async def test_on_an_untested_mcp_the_transport_gate_logs_that_mcps_own_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("mcpfleet.notify._resume.importlib.metadata.version", lambda _: "2.99.0")
    http_app = FastMCP("gate").http_app(path="/mcp")
    async with http_app.router.lifespan_context(http_app):
        with caplog.at_level(logging.INFO):
            assert not prime_sessions(http_app)
    assert not _messages(caplog, "mcpfleet.replica")
    (said,) = _messages(caplog, "mcpfleet.notify")
    assert "mcp 2.99.0 is not a version" in said


@pytest.mark.tasks
def test_the_tasks_gate_logs_the_engine_version_its_hooks_run_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fastmcp_tasks: Any = pytest.importorskip(
        "fastmcp_tasks", reason="the [tasks] extra: make test-tasks"
    )
    from mcpfleet.tasks._engine_hooks import tested_engine

    with caplog.at_level(logging.INFO, logger="mcpfleet.tasks"):
        tested_engine()
    (said,) = _messages(caplog, "mcpfleet.tasks")
    assert said.startswith(f"tasks: fastmcp-tasks {fastmcp_tasks.__version__} (tested on ")
    assert "engine hooks are installed" in said


@pytest.mark.tasks
def test_on_an_untested_engine_the_tasks_gate_refuses_and_logs_nothing_installed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fastmcp_tasks: Any = pytest.importorskip(
        "fastmcp_tasks", reason="the [tasks] extra: make test-tasks"
    )
    from mcpfleet.tasks._engine_hooks import TasksUnavailable, tested_engine

    monkeypatch.setattr(fastmcp_tasks, "__version__", "4.99.0")
    with (
        caplog.at_level(logging.INFO, logger="mcpfleet.tasks"),
        pytest.raises(TasksUnavailable, match=r"fastmcp-tasks 4\.99\.0 is not a version"),
    ):
        tested_engine()
    assert not _messages(caplog, "mcpfleet.tasks")
