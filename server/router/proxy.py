"""The sticky router: an ASGI reverse proxy in front of the replicas.

Per request (see :mod:`mcpfleet.server.router.decisions` for the pure decisions):

* ``Mcp-Session-Id`` present: to the session's owner (cache, then Redis). An
  owner that is gone, unknown, or refuses the connection gets the spec's 404
  at once and the entry is dropped, so the client re-initializes.
* ``initialize``: to the serving replica with the fewest sessions; the new
  session id is written to Redis before the response reaches the client, so
  any router can route the session's next request.
* everything else (modern era, sessionless): to any serving replica, chosen
  by power of two choices on requests in flight, with no Redis on the path.

Bodies and streams pass through unbuffered in both directions; a client that
goes away tears down the upstream request, and vice versa. Requests that no
replica processed (refused connection, a draining replica's 503) are resent
to another replica; nothing else is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import json
import logging
import time
from typing import Any

import aiohttp
from starlette.types import Message, Receive, Scope, Send

from mcpfleet.server.config import RouterConfig
from mcpfleet.server.contract import (
    DRAINING_HEADER,
    REPLICA_HEADER,
    ROUTER_ERROR_HEADER,
    RedisKeys,
)
from mcpfleet.server.registry import connect, redact_url
from mcpfleet.server.router.decisions import (
    OriginPolicy,
    RouteKind,
    classify,
    parses_as_json,
    pick_stateless,
    place_session,
    refused_origin,
    session_ids,
    valid_session_id,
)
from mcpfleet.server.router.metrics import RouterMetrics
from mcpfleet.server.router.table import Health, ReplicaView, SessionTable

log = logging.getLogger("mcpfleet.router")

#: Headers that describe one hop, never forwarded (RFC 9110 section 7.6.1), and
#: ``host``, which names the router; the upstream client sets the replica's own.
#: Headers only fleet components may set are in ``_CLIENT_MAY_NOT_SET``.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_CLIENT_MAY_NOT_SET = frozenset(
    {REPLICA_HEADER.lower(), DRAINING_HEADER.lower(), ROUTER_ERROR_HEADER.lower()}
)
#: Replica response headers the router replaces with its own (uvicorn adds them
#: to every response): forwarding them too would repeat them.
_REPLACED_BY_ROUTER = frozenset({"date", "server"})
#: A response body with a Content-Length up to this many bytes (every JSON answer
#: of a modern round) is read whole and sent in one message, without the pump's
#: two tasks per request: the largest share of the router's own per-request CPU
#: that is not a system call (``make bench`` measures both ways side by side).
#: Streams (SSE: no Content-Length) and larger bodies are always pumped.
WHOLE_BODY_LIMIT = 256 * 1024


class Outcome(enum.StrEnum):
    """How the router ended a request: the ``outcome`` label of ``mcpfleet_router_requests_total``.

    A :class:`Failure` of the last forward attempt is an outcome too.
    """

    OK = "ok"  # relayed a 1xx-3xx answer
    CLIENT_ERROR = "client_error"  # relayed (or, for an unknown session, made) a 4xx
    UPSTREAM_ERROR = "upstream_error"  # relayed a 5xx
    REJECTED = "rejected"  # refused by the router: bad or hostile input
    OWNER_GONE = "owner_gone"  # the session's owner is gone: the spec's 404
    UNAVAILABLE = "unavailable"  # the owner or the session directory cannot answer now
    NO_REPLICA = "no_replica"  # no serving replica (or all at their session cap)


class OwnerGone(enum.StrEnum):
    """Why a session's owner counts as gone: the ``reason`` of ``owner_gone_total``."""

    DEREGISTERED = "deregistered"  # known dead, or absent from the registry too long
    REFUSED = "refused"  # its address refused the connection
    UNKNOWN_TO_OWNER = "unknown_to_owner"  # it answered that it no longer has the session


class Route(enum.StrEnum):
    """The ``route`` label: a :class:`RouteKind`, or ``invalid`` for a request never routed."""

    INVALID = "invalid"


class Failure(enum.StrEnum):
    """Why a forward produced no upstream status; the values are metric labels."""

    REFUSED = "refused"  # the replica refused the connection: it is not listening
    TIMEOUT = "timeout"  # no connection within connect_timeout: maybe overloaded
    DRAINING = "draining"  # the replica declined the request before any work
    DISCONNECTED = "disconnected"  # the client went away first
    UPSTREAM_BROKE = "upstream_broke"  # the replica's response broke off midway

    @property
    def nothing_processed(self) -> bool:
        """True if the replica certainly did no work: the request may go elsewhere."""
        return self in (Failure.REFUSED, Failure.TIMEOUT, Failure.DRAINING)


def _error(code: int, message: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    ).encode()


async def _respond(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (ROUTER_ERROR_HEADER.lower().encode(), b"1"),
    ]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body})


async def _retry_later(send: Send, status: int, code: int, message: str) -> None:
    """A JSON-RPC error the client may retry in a second (503 or 502 with Retry-After)."""
    await _respond(send, status, _error(code, message), [(b"retry-after", b"1")])


def _forward_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    connection_listed: set[str] = set()
    for k, v in raw:
        if k.lower() == b"connection":
            connection_listed |= {t.strip().lower() for t in v.decode("latin-1").split(",")}
    out = []
    for k, v in raw:
        name = k.decode("latin-1").lower()
        if name in HOP_BY_HOP or name in connection_listed or name in _CLIENT_MAY_NOT_SET:
            continue
        out.append((name, v.decode("latin-1")))
    return out


def _response_headers(resp: aiohttp.ClientResponse, replica_base: str) -> list[tuple[bytes, bytes]]:
    """The replica's response headers as the client should see them.

    Hop-by-hop headers are dropped, and so are ``date``/``server`` (the router
    sets its own). A ``location`` pointing at the replica's own address (the
    app's trailing-slash redirect) is made relative, so a client that follows
    it comes back through the router instead of going around it.
    """
    drop = HOP_BY_HOP | _REPLACED_BY_ROUTER
    drop |= {t.strip().lower() for t in resp.headers.get("connection", "").split(",")}
    out = []
    for k, v in resp.raw_headers:
        name = k.decode("latin-1").lower()
        if name in drop:
            continue
        if name == "location" and v.decode("latin-1").startswith(replica_base + "/"):
            v = v[len(replica_base) :]
        out.append((k, v))
    return out


def _stale_connection(exc: aiohttp.ClientError) -> bool:
    """True for a connection closed or reset before any response: on a pooled keep-alive
    connection this means the replica never read the request (it closed the idle
    connection, or its process is gone), so one retry on a fresh connection is safe."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno in (
        errno.ECONNRESET,
        errno.EPIPE,
    )


class _TooLarge(Exception):
    pass


async def _read_body(receive: Receive, limit: int, timeout: float) -> bytes:
    """The whole request body (routing needs it), within ``limit`` bytes and ``timeout`` s."""
    async with asyncio.timeout(timeout):
        return await _read_body_unbounded(receive, limit)


async def _read_body_unbounded(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("client went away while sending")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class Router:
    """The ASGI application. Start it under uvicorn with ``lifespan='on'``."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.keys = RedisKeys(config.fleet)
        self.health = Health()
        self.redis = connect(config.redis_url)
        self.view = ReplicaView(
            self.redis, self.keys, self.health, absent_limit=config.owner_absent_limit
        )
        self.sessions = SessionTable(self.redis, self.keys, self.health, ttl=config.session_ttl)
        self.metrics = RouterMetrics()
        self.origin_policy = OriginPolicy.for_bind(
            config.host, config.allowed_hosts, config.allowed_origins
        )
        self.http: aiohttp.ClientSession | None = None
        #: Used only to retry a request whose pooled connection proved stale.
        self.fresh_http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------

    async def startup(self) -> None:
        # Idle upstream connections are dropped well before a replica would close
        # them (replica.REPLICA_KEEPALIVE): a request never races a closing connection.
        connector = aiohttp.TCPConnector(limit=2000, limit_per_host=0, keepalive_timeout=5.0)
        self.http = self._client_session(connector)
        self.fresh_http = self._client_session(aiohttp.TCPConnector(force_close=True))
        await self.view.refresh()
        log.info(
            "router for fleet %s, Redis %s: %d replica(s) known%s",
            self.config.fleet,
            redact_url(self.config.redis_url),
            len(self.view.replicas),
            " (degraded: Redis unreachable)" if self.health.degraded else "",
        )
        self._tasks.append(asyncio.create_task(self._refresh_loop(), name="replica-view"))

    def _client_session(self, connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            # Only connecting is bounded: streams may stay open for as long as they live.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_interval)
            was_degraded = self.health.degraded
            await self.view.refresh()
            self.metrics.degraded.set(1 if self.health.degraded else 0)
            self.metrics.observe_view(
                {n: a.state for n, a in self.view.replicas.items()},
                {n: a.sessions for n, a in self.view.replicas.items()},
            )
            if was_degraded and not self.health.degraded:
                # Redis may have restarted empty: put back what this router knows.
                await self.sessions.republish()

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for http in (self.http, self.fresh_http):
            if http is not None:
                await http.close()
        await self.redis.aclose()

    # --- ASGI ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def status(self) -> dict[str, Any]:
        return {
            "degraded": self.health.degraded,
            "replicas": {n: a.state for n, a in sorted(self.view.replicas.items())},
            "serving": len(self.view.serving()),
        }

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path == "/healthz":
            await _respond(send, 200, json.dumps({"status": "alive"}).encode())
            return
        if path == "/readyz":
            # Degraded (Redis down) is still ready: cached sessions and stateless
            # traffic keep flowing. Not ready only when no replica serves.
            status = self.status()
            await _respond(send, 200 if status["serving"] else 503, json.dumps(status).encode())
            return
        if path == "/metrics":
            body = self.metrics.render()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", self.metrics.content_type.encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        started = time.perf_counter()
        route, outcome = await self._route(scope, receive, send, started)
        self.metrics.requests.labels(route, outcome).inc()

    async def _route(
        self, scope: Scope, receive: Receive, send: Send, started: float
    ) -> tuple[str, Outcome | Failure]:
        """Handle one proxied request; returns (route kind, outcome) for the metrics."""
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        if sum(len(k) + len(v) for k, v in raw_headers) > self.config.max_header_bytes:
            await _respond(send, 431, _error(-32600, "Request headers too large"))
            return Route.INVALID, Outcome.REJECTED
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}
        refusal = refused_origin(headers.get("host"), headers.get("origin"), self.origin_policy)
        if refusal is not None:
            await _respond(send, 403, _error(-32600, f"Forbidden: {refusal}"))
            return Route.INVALID, Outcome.REJECTED
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.config.max_body_bytes:
            await _respond(send, 413, _error(-32600, "Request body too large"))
            return Route.INVALID, Outcome.REJECTED
        try:
            body = await _read_body(receive, self.config.max_body_bytes, self.config.body_timeout)
        except _TooLarge:
            await _respond(send, 413, _error(-32600, "Request body too large"))
            return Route.INVALID, Outcome.REJECTED
        except TimeoutError:
            await _respond(send, 408, _error(-32600, "Request body not received in time"))
            return Route.INVALID, Outcome.REJECTED
        except ConnectionResetError:
            return Route.INVALID, Failure.DISCONNECTED

        if len(session_ids(raw_headers)) > 1:
            # The router would route by one and the replica read another: refused
            # before any lookup, so no session is ever dropped on another's behalf.
            await _respond(send, 400, _error(-32600, "Bad Request: more than one Mcp-Session-Id"))
            return Route.INVALID, Outcome.REJECTED
        method: str = scope["method"]
        kind = classify(method, headers, body)
        if kind is not RouteKind.STICKY and method == "POST" and not parses_as_json(body):
            # Answered here: a replica would open (and leak) a session for it.
            await _respond(send, 400, _error(-32700, "Parse error: the body is not JSON"))
            return kind.value, Outcome.REJECTED
        if kind is RouteKind.STICKY:
            outcome = await self._sticky(
                scope, receive, send, headers["mcp-session-id"], body, started
            )
        else:
            outcome = await self._spread(scope, receive, send, kind, body, started)
        return kind.value, outcome

    async def _sticky(
        self, scope: Scope, receive: Receive, send: Send, session: str, body: bytes, started: float
    ) -> Outcome | Failure:
        if not valid_session_id(session):
            await _respond(send, 400, _error(-32600, "Bad Request: malformed Mcp-Session-Id"))
            return Outcome.REJECTED
        owner, source = await self.sessions.lookup(session)
        self.metrics.lookups.labels(source).inc()
        if owner is None:
            if source == "unknown":
                # Redis cannot say whether the session exists: a 404 could end a live one.
                await _retry_later(send, 503, -32000, "Session directory unavailable; retry")
                return Outcome.UNAVAILABLE
            await _respond(send, 404, _error(-32600, "Session not found"))
            return Outcome.CLIENT_ERROR
        address = self.view.owner_address(owner)
        if address is None:
            # Known dead, or absent from the registry for long: it left.
            return await self._owner_gone(send, session, owner, OwnerGone.DEREGISTERED)
        outcome = await self._forward(
            scope, receive, send, RouteKind.STICKY, owner, address, body, started
        )
        if outcome is Failure.REFUSED:
            self.view.forget(owner)
            return await self._owner_gone(send, session, owner, OwnerGone.REFUSED)
        if outcome is Failure.TIMEOUT:
            # Overloaded, or unreachable: not proof of death. The client may retry.
            await _retry_later(send, 503, -32000, "Session owner unavailable; retry")
            return Outcome.UNAVAILABLE
        if outcome is Failure.DRAINING:
            # Only a replica that no longer knows the session answers this way.
            return await self._owner_gone(send, session, owner, OwnerGone.UNKNOWN_TO_OWNER)
        if outcome == 404 or (
            scope["method"] == "DELETE" and isinstance(outcome, int) and outcome < 300
        ):
            await self.sessions.forget(session)
        return _outcome(outcome)

    async def _owner_gone(self, send: Send, session: str, owner: str, reason: OwnerGone) -> Outcome:
        log.info("session of %s answered 404: owner %s", owner, reason)
        await self.sessions.forget(session)
        self.metrics.owner_gone.labels(reason).inc()
        await _respond(send, 404, _error(-32600, "Session not found"))
        return Outcome.OWNER_GONE

    async def _spread(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: RouteKind,
        body: bytes,
        started: float,
    ) -> Outcome | Failure:
        tried: set[str] = set()
        for _ in range(self.config.attempts):
            candidates = self.view.serving(exclude=tried)
            if kind is RouteKind.INITIALIZE:
                choice = place_session(candidates, self.config.session_cap)
            else:
                choice = pick_stateless(candidates)
            if choice is None:
                break
            tried.add(choice.name)
            replica = self.view.get(choice.name)
            if replica is None:
                continue
            if kind is RouteKind.INITIALIZE:
                self.view.note_placement(choice.name)
            outcome = await self._forward(
                scope, receive, send, kind, replica.name, replica.address, body, started
            )
            if isinstance(outcome, Failure) and outcome.nothing_processed:
                if outcome is Failure.REFUSED:
                    self.view.forget(replica.name)
                self.metrics.retries.labels(outcome.value).inc()
                continue
            return _outcome(outcome)
        full = (
            kind is RouteKind.INITIALIZE
            and self.config.session_cap is not None
            and bool(self.view.serving())
        )
        message = "All replicas are at their session cap" if full else "No serving replica"
        await _retry_later(send, 503, -32000, message)
        return Outcome.NO_REPLICA

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: RouteKind,
        name: str,
        address: str,
        body: bytes,
        started: float,
    ) -> int | Failure:
        """Proxy one request to replica ``name``, counted in flight while it runs.

        Returns the status relayed to the client, or the :class:`Failure` that
        stopped it.
        """
        self.view.inflight[name] = self.view.inflight.get(name, 0) + 1
        try:
            return await self._proxy(scope, receive, send, kind, name, address, body, started)
        finally:
            self.view.inflight[name] -= 1

    async def _open(
        self, name: str, method: str, url: str, headers: list[tuple[str, str]], body: bytes
    ) -> aiohttp.ClientResponse:
        """Send the request upstream and return once the response headers arrived.

        A pooled connection the replica closed or reset before answering is
        retried once on a fresh connection: then a live replica answers, and a
        dead one refuses, which the caller turns into the spec's 404 at once.
        """
        assert self.http is not None and self.fresh_http is not None
        try:
            return await self.http.request(
                method, url, headers=headers, data=body or None, allow_redirects=False
            )
        except aiohttp.ClientConnectorError:
            raise
        except aiohttp.ClientError as exc:
            if not _stale_connection(exc):
                raise
            log.info("replica %s: pooled connection %s; retrying fresh", name, type(exc).__name__)
        return await self.fresh_http.request(
            method, url, headers=headers, data=body or None, allow_redirects=False
        )

    async def _proxy(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: RouteKind,
        name: str,
        address: str,
        body: bytes,
        started: float,
    ) -> int | Failure:
        url = address + scope["raw_path"].decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = _forward_headers(scope["headers"])
        client = scope.get("client")
        if client:
            headers.append(("x-forwarded-for", client[0]))
        try:
            upstream = await self._open(name, scope["method"], url, headers, body)
        except TimeoutError:
            log.warning(
                "replica %s did not accept a connection within %.1fs",
                name,
                self.config.connect_timeout,
            )
            return Failure.TIMEOUT
        except aiohttp.ClientConnectorError as exc:
            log.info("replica %s refused the connection: %s", name, exc.os_error)
            return Failure.REFUSED
        except aiohttp.ClientError as exc:
            log.warning("replica %s failed before answering: %s: %s", name, type(exc).__name__, exc)
            # The request may or may not have been processed: never resent. A
            # session survives this (its owner is alive); the client may retry.
            failure = f"Replica {name} dropped the connection: {type(exc).__name__}"
            status = 503 if kind is RouteKind.STICKY else 502
            await _retry_later(send, status, -32603, failure)
            return status
        result: int | Failure = Failure.UPSTREAM_BROKE
        try:
            if upstream.status == 503 and upstream.headers.get(DRAINING_HEADER):
                await upstream.read()
                result = Failure.DRAINING
                return result
            if kind is RouteKind.INITIALIZE and upstream.status == 200:
                session = upstream.headers.get("mcp-session-id")
                if session and valid_session_id(session):
                    await self.sessions.record(session, name)
            self.metrics.latency.labels(kind.value).observe(time.perf_counter() - started)
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status,
                    "headers": _response_headers(upstream, address),
                }
            )
            length = upstream.content_length
            if length is not None and length <= WHOLE_BODY_LIMIT:
                ended = await _relay_whole(upstream, send)
            else:
                ended = await self._pump(upstream, receive, send)
            if ended is None:
                result = upstream.status
            else:
                result = ended
                if ended is Failure.UPSTREAM_BROKE:
                    log.warning("replica %s broke off its response; aborting the client's", name)
            return result
        finally:
            if isinstance(result, int) or result is Failure.DRAINING:
                upstream.release()  # complete: back to the pool
            else:
                upstream.close()  # tear the upstream request down

    async def _pump(
        self, upstream: aiohttp.ClientResponse, receive: Receive, send: Send
    ) -> Failure | None:
        """Copy the upstream body to the client chunk by chunk until either side ends.

        Returns None when the body was relayed whole, :attr:`Failure.DISCONNECTED`
        if the client went away first (the upstream is then closed too), and
        :attr:`Failure.UPSTREAM_BROKE` if the replica's body broke off: then the
        client's response is left unfinished, and the server aborts the
        connection, so the client sees a broken stream, never a normal end.
        """

        async def copy() -> bool:
            try:
                async for chunk in upstream.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.info("upstream stream broke off: %s", type(exc).__name__)
                return False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return True

        async def client_gone() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    return

        copier = asyncio.ensure_future(copy())
        watcher = asyncio.ensure_future(client_gone())
        try:
            await asyncio.wait({copier, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (copier, watcher):
                task.cancel()
            for task in (copier, watcher):
                with contextlib.suppress(asyncio.CancelledError, OSError, RuntimeError):
                    await task
        if not copier.done() or copier.cancelled() or copier.exception() is not None:
            return Failure.DISCONNECTED
        return None if copier.result() else Failure.UPSTREAM_BROKE


async def _relay_whole(upstream: aiohttp.ClientResponse, send: Send) -> Failure | None:
    """Relay a body of known, bounded length in one message.

    The replica finished its work before it could state the length, so there is
    nothing to tear down if the client leaves meanwhile (uvicorn then drops the
    send). A body that breaks off leaves the client's response unfinished, as
    the pump does: the server aborts the connection.
    """
    try:
        body = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.info("upstream body broke off: %s", type(exc).__name__)
        return Failure.UPSTREAM_BROKE
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return None


def _outcome(result: int | Failure) -> Outcome | Failure:
    if isinstance(result, Failure):
        return result
    if result < 400:
        return Outcome.OK
    return Outcome.CLIENT_ERROR if result < 500 else Outcome.UPSTREAM_ERROR


def run_router(config: RouterConfig) -> None:
    import uvicorn

    from mcpfleet.server.router.http import bounded_protocol

    # uvicorn re-raises the SIGINT it handled; by then we are done.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.run(
            Router(config),
            host=config.host,
            port=config.port,
            http=bounded_protocol(config.header_timeout),
            limit_concurrency=config.max_connections,
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
