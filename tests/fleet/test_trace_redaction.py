"""What leaves the fleet in traces: a handshake session's spans, exported through a real
router and replicas to an OTLP/HTTP receiver, carry no session id, token or subject.

Two replicas of ``ownapp`` (deploy/own-app: FastMCP's ``RemoteAuthProvider`` over a
``JWTVerifier``) behind the router, tracing on with ``MCPFLEET_TRACES_IDENTITY=digest``,
export to :class:`fleetkit.otlp.Receiver` (the export decoded with
``opentelemetry-proto``, nothing of the SDK mocked). FastMCP's own spans are the
ones under test: it sets ``mcp.session.id`` and ``enduser.id`` again on its request
span after the span started. Run on both installs: FastMCP with ``[tracing]`` (.venv)
and the tasks engine's FastMCP (``-m tasks`` in .venv-tasks).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from fastmcp.server.auth.providers.jwt import JWTVerifier

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.rawsession import RawSession
from fleetkit.fleet import ProcessFleet, own_app_fleet
from fleetkit.otlp import Got, Receiver
from mcpfleet import tracing
from mcpfleet.dev.wait import wait_for
from mcpfleet.limits import principal_digest

from .conftest import shared

pytestmark = pytest.mark.fleet


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("fastmcp", id="fastmcp"),
        pytest.param("tasks-engine", id="tasks-engine", marks=pytest.mark.tasks),
    ],
)
def install(request: pytest.FixtureRequest) -> str:
    """Which install runs the fleet: the tasks engine's only where it is installed."""
    if request.param == "tasks-engine":
        pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks")
    return str(request.param)


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def fleet(
    install: str,
    tmp_path_factory: pytest.TempPathFactory,
    issuer: TokenIssuer,
    receiver: Receiver,
) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp(f"redaction-{install}")
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        tracing.IDENTITY_ENV: tracing.DIGEST,
    }
    with own_app_fleet(workdir, issuer, env=env) as lf, shared(lf):
        yield lf


def _traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


async def _session(url: str, token: str, trace_id: str) -> str:
    """A handshake session through the router, every request in trace ``trace_id``:
    initialize, a ``tools/call`` answered at once, one that elicits and its answer.
    The session's id."""
    headers = {"authorization": f"Bearer {token}", "traceparent": _traceparent(trace_id)}
    async with httpx.AsyncClient(timeout=15) as http:
        session = RawSession(url, http, headers=headers)
        await session.open("redaction-client")
        who = await session.call_tool("whoami", {})
        assert "signed in as" in str(who), who
        pending = await session.start_elicitation("place_order", {"item": "tea", "quantity": 2})
        # A yes/no question: its answer is the value of a one-field form.
        answered = await session.answer(pending.request_id, {"value": True})
        assert answered.status_code == 202, answered.text
        await asyncio.wait_for(asyncio.shield(pending.reader), 15)
        await pending.aclose()
    return session.session


async def _principal(issuer: TokenIssuer, token: str) -> str:
    """The principal's digest of ``token``, as the replicas' limits name it."""
    verifier = JWTVerifier(
        public_key=issuer.public_pem, issuer=issuer.issuer, audience=issuer.audience
    )
    verified = await verifier.verify_token(token)
    assert verified is not None
    digest = principal_digest({"user": SimpleNamespace(access_token=verified)})
    assert digest is not None
    return digest


def test_a_handshake_sessions_spans_leave_the_fleet_without_its_id_token_or_subject(
    fleet: ProcessFleet, receiver: Receiver, issuer: TokenIssuer
) -> None:
    user = f"user-{secrets.token_hex(6)}"
    token = issuer.token(user)
    trace_id = secrets.token_hex(16)
    session = asyncio.run(_session(fleet.url, token, trace_id))

    def arrived() -> list[Got] | None:
        spans = receiver.of_trace(trace_id)
        names = [s.name for s in spans]
        routers = [s for s in spans if s.service == "mcpfleet-router"]
        # initialize, initialized, whoami, place_order and its answer
        done = "tools/call whoami" in names and "tools/call place_order" in names
        return spans if done and len(routers) == 5 else None

    spans = wait_for(arrived, timeout=20, what="the session's spans")
    leaked = [s for s in spans if session in s.exported_text() or token in s.exported_text()]
    assert leaked == [], leaked
    assert [s for s in spans if user in s.exported_text()] == []
    principal = asyncio.run(_principal(issuer, token))
    for name in ("tools/call whoami", "tools/call place_order"):
        (call,) = [s for s in spans if s.name == name]
        # FastMCP set both on its span; they left as digests.
        assert call.attributes["mcp.session.id"] == tracing.redacted(session), call
        assert call.attributes["enduser.id"] == principal, call
        assert call.attributes[tracing.PRINCIPAL_ATTRIBUTE] == principal, call
        assert "error.type" not in call.attributes, call
    addresses = {s.attributes["client.address"] for s in spans if "client.address" in s.attributes}
    assert addresses and all(a.startswith("sha256:") for a in addresses), addresses
