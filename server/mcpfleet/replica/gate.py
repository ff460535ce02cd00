"""The replica's front door: health, the replica header, drain, and session bookkeeping.

An ASGI middleware around the FastMCP HTTP app that

* answers ``/healthz`` (the process lives) and ``/readyz`` (it runs, so a ring is loaded,
  and the replica takes new work; 503 once draining);
* stamps ``X-Mcpfleet-Replica`` on every response;
* learns which handshake-era sessions it owns from the ``Mcp-Session-Id`` that
  answers an ``initialize``, and forgets them on ``DELETE``; marks a 404 for a
  session it does not hold with ``X-Mcpfleet-Session-Ended`` (a 404 for one it
  holds answers another principal: the session lives on);
* counts requests in flight (standalone GET listening streams apart: they
  never end by themselves and must not hold a drain open);
* once draining, refuses new sessions and stateless rounds with a 503 carrying
  ``X-Mcpfleet-Draining`` (the router may safely resend those elsewhere), while
  requests of sessions it owns keep being served (with ``drain_handover``,
  docs/rehome.md, only those of sessions with a request in flight: the idle
  ones are handed over to re-homing routers);
* on the answer to an ``initialize`` that opened a session, names the
  principal's digest (``X-Mcpfleet-Principal``) and whether the app allows
  re-homing (``X-Mcpfleet-Rehome: 0`` when it does not), for the router;
* keeps the connection once a response is whole: what the app sends after it, or
  raises, is logged and goes no further. uvicorn closes the connection on either,
  and the router may already have queued the next request on it (keep-alive): that
  request, received or not, would be lost with it. mcp's streamable HTTP transport
  does so when a request's session ends under it after its SSE answer finished
  (its error path then starts a 500 on the finished response).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpfleet.answers import jsonrpc_error, send_whole
from mcpfleet.contract import (
    CLIENT_SESSION_HEADER,
    DRAINING_HEADER,
    PRINCIPAL_HEADER,
    REHOME_HEADER,
    REPLICA_HEADER,
    SESSION_ENDED_HEADER,
    SESSION_HEADER,
)
from mcpfleet.limits import principal_digest

_SESSION_KEY = SESSION_HEADER.lower().encode()
_ENDED = (SESSION_ENDED_HEADER.lower().encode(), b"1")
_NO_REHOME = (REHOME_HEADER.lower().encode(), b"0")
_PRINCIPAL = PRINCIPAL_HEADER.lower().encode()
_CLIENT_SESSION = CLIENT_SESSION_HEADER.lower().encode()

log = logging.getLogger("mcpfleet.replica")


@dataclass
class GateState:
    """What the gate knows; read by the heartbeat and the drain loop."""

    name: str
    draining: bool = False
    inflight: int = 0
    streams: int = 0
    sessions: dict[str, float] = field(default_factory=dict)
    session_idle: float = 1800.0
    #: Whether routers may re-open this app's sessions elsewhere (ReplicaConfig.session_rehome).
    rehome: bool = True
    #: Set when a replica drains with ``drain_handover``: a request of a session
    #: with no request in flight is refused as drained (503 with
    #: X-Mcpfleet-Draining, nothing run), and the router re-homes the session;
    #: sessions with work in flight keep being served until it ends.
    handover: bool = False
    #: Requests in flight (not GET streams) per session, for the handover.
    busy: dict[str, int] = field(default_factory=dict)
    #: The client's own id of a busy re-homed session (the router names it), by
    #: this replica's id: the drain deadline marks the session lost under it.
    aliases: dict[str, str] = field(default_factory=dict)

    def busy_client_sessions(self) -> list[str]:
        """The sessions with a request in flight, by the ids their clients use."""
        return [self.aliases.get(s, s) for s in self.busy]

    def live_sessions(self, now: float | None = None) -> int:
        """Sessions active within the idle timeout; older ones are forgotten here.

        The framework closes a session idle that long, so it is gone either way;
        forgetting it keeps this table bounded by the live sessions.
        """
        now = time.monotonic() if now is None else now
        stale = [s for s, seen in self.sessions.items() if now - seen >= self.session_idle]
        for session in stale:
            del self.sessions[session]
        return len(self.sessions)

    def idle(self, now: float | None = None) -> bool:
        """No request in flight and no open session: a draining replica may exit.

        A session counts as open until it is deleted or idle past the session
        timeout. Waiting for quiet instead would race a session's
        next request; the drain deadline bounds sessions that are never closed.
        """
        return self.inflight == 0 and self.live_sessions(now) == 0


def _header(scope: Scope, key: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == key:
            return str(v.decode("latin-1"))
    return None


async def _plain(
    send: Send, status: int, body: dict[str, object] | bytes, extra: list[tuple[bytes, bytes]]
) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    await send_whole(send, status, payload, headers=extra)


class ReplicaGate:
    """ASGI middleware; see the module docstring.

    :meth:`__call__` runs for every request the replica serves. A sessionless
    round (the modern era's) passes through it without another call: the
    request counted, the app called, the response stamped. The rest are methods
    of their own: the gate's routes, a drain's refusal, the books of a
    handshake-era session's request, a session opened.
    """

    def __init__(
        self,
        app: ASGIApp,
        state: GateState,
        *,
        extra_routes: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] | None = None,
    ) -> None:
        self.app = app
        self.state = state
        self.extra_routes = extra_routes or {}
        self._name_header = (REPLICA_HEADER.lower().encode(), state.name.encode())
        # The routes the gate answers itself (its own first), in one lookup per request.
        self._routes: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            **self.extra_routes,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        route = self._routes.get(path)
        if route is not None:
            await route(scope, receive, send)
            return
        st = self.state
        method: str = scope["method"]
        session = _header(scope, _SESSION_KEY)
        owned = session is not None and session in st.sessions
        handed_over = st.handover and owned and not st.busy.get(session or "")
        if st.draining and (not owned or handed_over):
            await self._refuse_draining(send)
            return

        listening = method == "GET"
        if owned and session is not None:
            self._enter(session, scope, listening)
        if listening:
            st.streams += 1
        else:
            st.inflight += 1
        whole = False

        async def stamped_send(message: Message) -> None:
            nonlocal whole
            if whole:
                _dropped_after_whole(method, path, message)
                return
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append(self._name_header)
                message = {**message, "headers": headers}
                if session is not None:
                    self._answered(session, owned, method, message["status"], headers)
                elif method == "POST" and message["status"] == 200:
                    created = next((v for k, v in headers if k == _SESSION_KEY), None)
                    if created is not None:
                        self._opened(created, scope, headers)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                whole = True

        try:
            await self.app(scope, receive, stamped_send)
        except Exception:
            if not whole:
                raise
            _kept_after_whole(method, path)
        finally:
            if listening:
                st.streams -= 1
            else:
                st.inflight -= 1
            if owned and session is not None:
                self._leave(session, listening)

    def _enter(self, session: str, scope: Scope, listening: bool) -> None:
        """A request of ``session``, which this replica holds, starts."""
        st = self.state
        st.sessions[session] = time.monotonic()
        if not listening:
            st.busy[session] = st.busy.get(session, 0) + 1
            client_session = _header(scope, _CLIENT_SESSION)
            if client_session is not None:
                st.aliases[session] = client_session

    def _leave(self, session: str, listening: bool) -> None:
        """A request of ``session``, which this replica held when it started, ends."""
        st = self.state
        if not listening:
            left = st.busy.get(session, 1) - 1
            if left > 0:
                st.busy[session] = left
            else:
                st.busy.pop(session, None)
                st.aliases.pop(session, None)
        if session in st.sessions:
            st.sessions[session] = time.monotonic()

    def _answered(
        self,
        session: str,
        owned: bool,
        method: str,
        status: int,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """The app answers a request of ``session``: the books kept, the router told."""
        if method == "DELETE" and status < 300:
            self.state.sessions.pop(session, None)
        if status == 404 and not owned:
            # No such session here (never opened, or ended): say so to the
            # router. A 404 on a session this replica holds answers a
            # credential that is not the session's: the session lives on.
            headers.append(_ENDED)

    async def _healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/healthz``: the process lives."""
        await _plain(
            send, 200, {"status": "alive", "replica": self.state.name}, [self._name_header]
        )

    async def _readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/readyz``: ready until the replica drains.

        A replica without a key ring never starts: serving, it is ready until it drains.
        """
        st = self.state
        reason = "draining" if st.draining else "ready"
        await _plain(
            send,
            503 if st.draining else 200,
            {"status": reason, "replica": st.name},
            [self._name_header],
        )

    async def _refuse_draining(self, send: Send) -> None:
        """The draining replica's 503: nothing ran, the router may send it elsewhere."""
        await _plain(
            send,
            503,
            jsonrpc_error(-32000, f"replica {self.state.name} is draining"),
            [
                self._name_header,
                (DRAINING_HEADER.lower().encode(), b"1"),
                (b"retry-after", b"1"),
            ],
        )

    def _opened(self, created: bytes, scope: Scope, headers: list[tuple[bytes, bytes]]) -> None:
        """The app opened session ``created``: learn it, and tell the router what it needs."""
        st = self.state
        st.sessions[created.decode("latin-1")] = time.monotonic()
        digest = principal_digest(scope)
        if digest is not None:
            headers.append((_PRINCIPAL, digest.encode()))
        if not st.rehome:
            headers.append(_NO_REHOME)


def _dropped_after_whole(method: str, path: str, message: Message) -> None:
    log.warning(
        "%s %s: the app sent %s after its response was whole; dropped",
        method,
        path,
        message["type"],
    )


def _kept_after_whole(method: str, path: str) -> None:
    """Called in an ``except`` block: the traceback is the exception being handled."""
    log.warning(
        "%s %s raised after its response was whole; the connection is kept",
        method,
        path,
        exc_info=True,
    )
