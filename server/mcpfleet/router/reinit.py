"""Opening a session again on a live replica: what re-opens it, and the requests.

What the router keeps per session (:class:`InitRecord`, in Redis beside the
route, written at ``initialize``): the client's ``initialize`` parameters and
a digest of the principal that opened the session, never a token.
:func:`reopen` opens the session again on a replica with them and the
current request's credentials; :func:`close_session` ends one the router
opened and will not use. The re-home that calls them is
:class:`~mcpfleet.router.rehome.Rehomer`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcpfleet.contract import MCP_PATH, PRINCIPAL_HEADER, REHOME_HEADER, SESSION_HEADER
from mcpfleet.router.decisions import valid_session_id
from mcpfleet.router.h1client import Pool
from mcpfleet.router.upstream import forward_header_block

#: The largest stored ``initialize`` parameters (bytes of JSON); a session whose
#: client sent more is not re-homable (its route works as ever).
INIT_LIMIT = 16 * 1024
#: The parameters of ``initialize`` that open a session again, and nothing else.
INIT_FIELDS = ("protocolVersion", "capabilities", "clientInfo")

_SESSION = SESSION_HEADER.lower().encode()
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


@dataclass(frozen=True)
class Reopened:
    """The answer of a re-home's ``initialize`` on a live replica."""

    status: int
    #: The new session's id on that replica, its ``upstream_id`` in the session's
    #: route (None unless a 200 named a valid one).
    upstream_id: str | None
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
    named = resp.headers.get(SESSION_HEADER)
    upstream_id = named if resp.status == 200 and named and valid_session_id(named) else None
    version = _result_version(
        answer, resp.headers.get("content-type") or "", str(record.params["protocolVersion"])
    )
    reopened = Reopened(
        status=resp.status,
        upstream_id=upstream_id,
        principal=resp.headers.get(PRINCIPAL_HEADER) or "",
        allowed=resp.headers.get(REHOME_HEADER) != "0",
        version=version,
        raw_headers=list(resp.raw_headers),
        body=answer,
    )
    if upstream_id is None or not reopened.allowed or reopened.principal != record.principal:
        return reopened
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
    session_headers = headers + (
        b"mcp-session-id: %s\r\nmcp-protocol-version: %s\r\n"
        % (upstream_id.encode("latin-1"), version.encode("latin-1"))
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
    pool: Pool, address: str, client_headers: list[tuple[bytes, bytes]], upstream_id: str
) -> None:
    """DELETE a session the router opened on the replica at ``address`` and will not
    use (``upstream_id``: that replica's id for it; best effort, caller-bounded)."""
    base = forward_header_block(
        [(k, v) for k, v in client_headers if k.lower() not in _NOT_FOR_REINIT], None
    )
    headers = base + b"mcp-session-id: %s\r\n" % upstream_id.encode("latin-1")
    resp = await pool.request(address, b"DELETE", MCP_PATH.encode(), headers, b"")
    try:
        await resp.read()
    finally:
        resp.release()
