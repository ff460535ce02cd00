"""The replica process: ``mcpfleet serve`` runs :func:`run_replica`.

It reads the key ring (refusing to start without a valid one), sets up traces
and quiets the loggers that would log session ids, builds the
:class:`~mcpfleet.replica.runtime.Replica`, and serves it under uvicorn, the
replica's watcher and heartbeat run inside the app's lifespan
(:func:`build_asgi`); SIGTERM drains first (:mod:`mcpfleet.replica.drain`), a
second signal or SIGINT exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.config import ReplicaConfig
from mcpfleet.keys.files import read_ring
from mcpfleet.redisconn import redact_url
from mcpfleet.replica.runtime import Replica
from mcpfleet.replica.tracing import request_principal
from mcpfleet.sigterm import SigtermFirstServer

log = logging.getLogger("mcpfleet.replica")

#: Seconds an idle keep-alive connection to a replica stays open.
REPLICA_KEEPALIVE = 75

#: The MCP SDK's session manager logs every session id at INFO; a handshake
#: session id is bearer-equivalent where the app has no auth.
SESSION_ID_LOGGERS = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http")


class _DrainingServer(SigtermFirstServer):
    """uvicorn, but SIGTERM drains first; a second signal or SIGINT exits at once."""

    def __init__(self, config: uvicorn.Config, replica: Replica) -> None:
        super().__init__(config)
        self.replica = replica
        self._drain_task: asyncio.Task[None] | None = None

    def on_sigterm(self) -> None:
        async def drain_then_exit() -> None:
            await self.replica.drain()
            self.should_exit = True

        self._drain_task = asyncio.ensure_future(drain_then_exit())


class _WithLifespan:
    """An ASGI app whose lifespan also runs ``lifespan`` inside the wrapped app's own.

    The replica's watcher and heartbeat start once the app (FastMCP's session
    manager) has started, and stop before it stops, through the ASGI lifespan
    messages alone: nothing of Starlette's is patched.
    """

    def __init__(
        self, app: ASGIApp, lifespan: Callable[[], contextlib.AbstractAsyncContextManager[None]]
    ) -> None:
        self.app = app
        self.lifespan = lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        stack = contextlib.AsyncExitStack()

        async def ours_after_startup(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await stack.enter_async_context(self.lifespan())
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
            await send(message)

        async def ours_before_shutdown() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await stack.aclose()
            return message

        try:
            await self.app(scope, ours_before_shutdown, ours_after_startup)
        finally:
            await stack.aclose()


def build_asgi(replica: Replica) -> ASGIApp:
    """The replica's ASGI app, with the watcher and heartbeat run by its lifespan."""
    return _WithLifespan(replica.asgi, replica.lifespan)


def run_replica(config: ReplicaConfig) -> None:
    """Serve one replica until drained (SIGTERM) or stopped (SIGINT)."""
    ring = read_ring(config.keys_dir)
    # Traces, when the OTEL_* environment asks for them: before the app is loaded,
    # so FastMCP's spans stay on (appload.quiet_telemetry) and join the request's.
    tracing.configure("mcpfleet-replica", config.resolved_name(), principal=request_principal)
    for name in SESSION_ID_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
    replica = Replica(config, ring)
    replica.freeze_gc = True
    log.info(
        "replica %s serving %s at %s, key ring kids %s, fleet %s, redis %s",
        replica.name,
        config.app,
        replica.address,
        list(ring.kids),
        config.fleet,
        redact_url(config.redis_url) if config.redis_url else "none (standalone)",
    )
    uv_config = uvicorn.Config(
        build_asgi(replica),
        host=config.host,
        port=config.port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=2,
        access_log=False,
        # Longer than the router keeps idle connections (5 s), so the router
        # always closes first and never sends a request down a closing one.
        timeout_keep_alive=REPLICA_KEEPALIVE,
        # The client's address comes from the trusted hops (mcpfleet.limits), never
        # from uvicorn's reading of X-Forwarded-For (which trusts 127.0.0.1's).
        proxy_headers=False,
    )
    server = _DrainingServer(uv_config, replica)
    # uvicorn re-raises the SIGINT it handled; by then we are done.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    log.info("replica %s stopped", replica.name)
