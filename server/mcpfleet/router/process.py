"""The router process: uvicorn serving :class:`~mcpfleet.router.proxy.Router` on the
router's own HTTP protocol, with the router's shutdown.

Shutdown (SIGTERM, after the Pod's preStop pause): for ``drain_linger`` seconds
the router still serves, but every response carries ``Connection: close`` and
/readyz answers 503 (the router's ``closing``), so each client's keep-alive
connection is closed by the router right after an answer; then uvicorn's
graceful shutdown lets what is in flight finish (``graceful_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from mcpfleet import tracing
from mcpfleet.config import RouterConfig
from mcpfleet.router.proxy import Router
from mcpfleet.sigterm import SigtermFirstServer

log = logging.getLogger("mcpfleet.router")


class ClosingServer(SigtermFirstServer):
    """uvicorn, but SIGTERM first closes keep-alive connections for ``drain_linger``
    seconds (the router's ``closing``), then shuts down; a second signal or SIGINT
    exits at once."""

    def __init__(self, config: uvicorn.Config, router: Router) -> None:
        super().__init__(config)
        self.router = router

    def takes_sigterm(self) -> bool:
        return self.router.config.drain_linger > 0

    def on_sigterm(self) -> None:
        linger = self.router.config.drain_linger
        self.router.closing = True
        log.info("SIGTERM: closing client connections for %.1fs, then shutting down", linger)
        asyncio.get_running_loop().call_later(linger, self._shut_down)

    def _shut_down(self) -> None:
        self.should_exit = True


def router_server(config: RouterConfig) -> ClosingServer:
    from mcpfleet.router.h1server import bounded_protocol

    router = Router(config)
    router.freeze_gc = True
    uv_config = uvicorn.Config(
        router,
        host=config.host,
        port=config.port,
        http=bounded_protocol(
            config.header_timeout, config.max_connections, config.max_header_bytes
        ),
        log_level="warning",
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=config.graceful_timeout,
        # The client is the connection's peer: uvicorn must not take it from a
        # client's X-Forwarded-For (it trusts 127.0.0.1's by default). The router
        # appends the peer to the header; replicas read it through trusted hops.
        proxy_headers=False,
    )
    return ClosingServer(uv_config, router)


def run_router(config: RouterConfig) -> None:
    # Traces, when the OTEL_* environment asks for them (before the router reads tracing.ON).
    tracing.configure("mcpfleet-router", socket.gethostname())
    server = router_server(config)
    # uvicorn re-raises the SIGINT it handled; by then we are done.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
