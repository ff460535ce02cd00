"""Re-homing an idle handshake session whose replica is gone (router ``--rehome-sessions``).

What the router keeps per session (:class:`InitRecord`, in Redis beside the
route): the client's ``initialize`` parameters and a digest of the principal
that opened the session, never a token. When the owner is gone and the
session had no work in flight, the router opens the session again on a live
replica (:func:`reopen`: ``initialize`` with the stored parameters and the
current request's credentials, then ``notifications/initialized``), records
the route as the new owner and the new owner's session id
(:func:`join_route`), and forwards the request with the session id swapped
(:func:`swap_session`); answers carry the client's id back. docs/rehome.md
tells what a client sees, and what this does not cover.

Pure helpers here; the decisions and the books live in
:class:`~mcpfleet.router.proxy.Router`, the Redis records in
:class:`~mcpfleet.router.table.SessionTable`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from mcpfleet.contract import (
    CLIENT_SESSION_HEADER,
    LOST_AT_DRAIN_DEADLINE,
    MCP_PATH,
    PRINCIPAL_HEADER,
    REHOME_HEADER,
    SESSION_HEADER,
)
from mcpfleet.router.decisions import valid_session_id
from mcpfleet.router.h1 import Pool
from mcpfleet.router.upstream import forward_header_block

#: The largest stored ``initialize`` parameters (bytes of JSON); a session whose
#: client sent more is not re-homable (its route works as ever).
INIT_LIMIT = 16 * 1024
#: The parameters of ``initialize`` that open a session again, and nothing else.
INIT_FIELDS = ("protocolVersion", "capabilities", "clientInfo")

_SESSION = SESSION_HEADER.lower().encode()
_CLIENT_SESSION = CLIENT_SESSION_HEADER.lower().encode()
#: Request headers that belong to the client's own request, never to the
#: re-home's ``initialize`` (the upstream client sets length and host).
_NOT_FOR_REINIT = frozenset(
    {
        _SESSION,
        b"content-type",
        b"accept",
        b"mcp-protocol-version",
        b"last-event-id",
        b"mcp-method",
        b"mcp-name",
    }
)


class Lost(enum.StrEnum):
    """Why a session whose owner went was ended with the 404 instead of re-homed:
    the ``reason`` of ``mcpfleet_router_sessions_lost_total``."""

    #: This router had a request of the session in flight on the gone owner.
    IN_FLIGHT = "in_flight"
    #: A router's forwarded request of the session broke when the owner went
    #: (marked in Redis before that router answered).
    REQUEST_BROKE = "request_broke"
    #: The request answers (or cancels) a request of the gone owner: an
    #: elicitation's answer, a ``notifications/cancelled``.
    ANSWER_ORPHANED = "answer_orphaned"
    #: The live replica refused to open the session again (not a credential's 401/403).
    REFUSED = "refused"
    #: Its replica's drain deadline cut a request of the session (the replica
    #: marked it in Redis before it stopped, whatever the router saw of the end).
    DRAIN_DEADLINE = LOST_AT_DRAIN_DEADLINE


@dataclass(frozen=True)
class InitRecord:
    """What opens a session again: the client's parameters, the owner's principal digest."""

    params: dict[str, Any]
    #: ``""`` when the session was opened without a verified credential.
    principal: str

    def to_json(self) -> str:
        return json.dumps({"params": self.params, "principal": self.principal})

    @classmethod
    def from_json(cls, raw: bytes | str | None) -> InitRecord | None:
        """The record, or None when absent or not one (never trusted further)."""
        if raw is None or len(raw) > INIT_LIMIT + 256:
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(doc, dict):
            return None
        params, principal = doc.get("params"), doc.get("principal")
        if not isinstance(params, dict) or not isinstance(principal, str):
            return None
        return cls(params, principal)


def initialize_params(body: bytes) -> dict[str, Any] | None:
    """The re-home parameters of an ``initialize`` request body (one message, not a
    batch), or None when there are none to keep or they are too large."""
    if len(body) > 4 * INIT_LIMIT:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("method") != "initialize":
        return None
    params = doc.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("protocolVersion"), str):
        return None
    kept = {k: params[k] for k in INIT_FIELDS if k in params}
    if len(json.dumps(kept)) > INIT_LIMIT:
        return None
    return kept


def join_route(owner: str, upstream_session: str | None) -> str:
    """A session's route as stored: the owner, and the owner's own session id when
    it differs from the client's (a re-homed session)."""
    return owner if upstream_session is None else f"{owner} {upstream_session}"


def split_route(route: str) -> tuple[str, str | None]:
    """The owner and the owner's session id (None: the client's own) of a route."""
    owner, _, upstream_session = route.partition(" ")
    return owner, (upstream_session or None)


def answers_gone_work(body: bytes) -> bool:
    """Whether a POST body answers or cancels something the gone owner asked or ran:
    a JSON-RPC response (an elicitation's answer) or ``notifications/cancelled``.
    Such a session had work in flight: it is not re-homed."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    items = doc if isinstance(doc, list) else [doc]
    for item in items:
        if not isinstance(item, dict):
            continue
        if "method" not in item and ("result" in item or "error" in item):
            return True
        if item.get("method") == "notifications/cancelled":
            return True
    return False


def swap_session(
    raw_headers: list[tuple[bytes, bytes]], old: str, new: str
) -> list[tuple[bytes, bytes]]:
    """``raw_headers`` with the session id ``old`` replaced by ``new``."""
    old_b, new_b = old.encode("latin-1"), new.encode("latin-1")
    return [(k, new_b if k.lower() == _SESSION and v == old_b else v) for k, v in raw_headers]


def client_session_line(session: str) -> bytes:
    """The header line naming a re-homed session's own (client's) id to its replica."""
    return b"%s: %s\r\n" % (_CLIENT_SESSION, session.encode("latin-1"))


@dataclass(frozen=True)
class Reopened:
    """The answer of a re-home's ``initialize`` on a live replica."""

    status: int
    #: The new session's id on that replica (None unless a 200 named a valid one).
    session: str | None
    #: The principal digest the replica reported (``""`` without auth).
    principal: str
    #: False when the replica's app opted out of re-homing.
    allowed: bool
    #: The negotiated protocol version (for ``notifications/initialized``).
    version: str
    #: The answer's headers and body, relayed to the client on a 401/403.
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes


def _result_version(resp_body: bytes, content_type: str, fallback: str) -> str:
    text = resp_body.decode("utf-8", "replace")
    if content_type.startswith("text/event-stream"):
        data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        text = data[-1] if data else ""
    try:
        doc = json.loads(text)
        version = doc["result"]["protocolVersion"]
    except (ValueError, KeyError, TypeError):
        return fallback
    return version if isinstance(version, str) else fallback


async def reopen(
    pool: Pool,
    address: str,
    client_headers: list[tuple[bytes, bytes]],
    record: InitRecord,
) -> Reopened:
    """Open the session again on the replica at ``address``: ``initialize`` with the
    stored parameters and the client's current credentials (every header of its
    request but the session's and the message's own), then, on success,
    ``notifications/initialized``. Raises what :meth:`Pool.request` raises;
    the caller bounds the time."""
    base = forward_header_block(
        [(k, v) for k, v in client_headers if k.lower() not in _NOT_FOR_REINIT], None
    )
    headers = (
        base + b"content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
    )
    body = json.dumps(
        {"jsonrpc": "2.0", "id": "mcpfleet-rehome", "method": "initialize", "params": record.params}
    ).encode()
    resp = await pool.request(address, b"POST", MCP_PATH.encode(), headers, body)
    try:
        answer = await resp.read()
    finally:
        resp.release()
    created = resp.headers.get(SESSION_HEADER)
    session = created if resp.status == 200 and created and valid_session_id(created) else None
    version = _result_version(
        answer, resp.headers.get("content-type") or "", str(record.params["protocolVersion"])
    )
    reopened = Reopened(
        status=resp.status,
        session=session,
        principal=resp.headers.get(PRINCIPAL_HEADER) or "",
        allowed=resp.headers.get(REHOME_HEADER) != "0",
        version=version,
        raw_headers=list(resp.raw_headers),
        body=answer,
    )
    if session is None or not reopened.allowed or reopened.principal != record.principal:
        return reopened
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
    session_headers = headers + (
        b"mcp-session-id: %s\r\nmcp-protocol-version: %s\r\n"
        % (session.encode("latin-1"), version.encode("latin-1"))
    )
    ack = await pool.request(address, b"POST", MCP_PATH.encode(), session_headers, note)
    try:
        await ack.read()
    finally:
        ack.release()
    if ack.status >= 300:
        return Reopened(ack.status, None, reopened.principal, True, version, [], b"")
    return reopened


async def close_session(
    pool: Pool, address: str, client_headers: list[tuple[bytes, bytes]], session: str
) -> None:
    """DELETE a session the router opened and will not use (best effort, caller-bounded)."""
    base = forward_header_block(
        [(k, v) for k, v in client_headers if k.lower() not in _NOT_FOR_REINIT], None
    )
    headers = base + b"mcp-session-id: %s\r\n" % session.encode("latin-1")
    resp = await pool.request(address, b"DELETE", MCP_PATH.encode(), headers, b"")
    try:
        await resp.read()
    finally:
        resp.release()
