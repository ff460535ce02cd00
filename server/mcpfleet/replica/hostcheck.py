"""FastMCP's Host/Origin guard with its verdicts kept: the same answers, judged once per pair.

The replica refuses DNS rebinding with FastMCP's own guard
(:class:`fastmcp.server.http.HostOriginGuardMiddleware`, "auto" mode): 421 for
a ``Host`` it does not serve, 403 for a browser ``Origin`` it does not trust.
That guard normalizes its allow-list and the request's values on every request
(URL splitting, ``ipaddress`` parsing, ``fnmatch``): about 6% of the replica's
CPU on a guard round, the largest cost mcpfleet added over plain FastMCP.

Its verdict depends on nothing but the guard's fixed settings and four values
of the request: the address the server is bound to (``scope["server"]``), the
scheme, and the first ``Host`` and ``Origin`` headers (as Starlette's
``Headers.get`` reads them). :class:`KeptHostGuard` runs FastMCP's guard
itself the first time a combination is seen and remembers the combinations it
let through; a request with a remembered combination goes straight on. A
refused combination is never remembered: every refusal is FastMCP's guard
answering, so a refused request gets exactly the response it got before. At
most :data:`KEPT_LIMIT` combinations are kept; past that (a client making up
``Host`` values), the rest are judged each time, as before.

Pinned by ``tests/unit/test_hostcheck.py``: the verdicts, kept or not, equal
FastMCP's guard's over a matrix of binds, hosts and origins. The upstream
change that would remove this module: FastMCP normalizing the allow-list once
at construction and caching per-request verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from fastmcp.server.http import HostOriginGuardMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["KEPT_LIMIT", "KeptHostGuard"]

#: How many allowed (bind, scheme, Host, Origin) combinations are remembered.
KEPT_LIMIT: Final = 256

_Key = tuple[object, str, bytes, bytes | None]


def _key(scope: Scope) -> _Key:
    """What the verdict depends on; the first ``Host`` and ``Origin``, as Starlette reads them."""
    host: bytes | None = None
    origin: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"host":
            if host is None:
                host = value
        elif name == b"origin" and origin is None:
            origin = value
    server = scope.get("server")
    return (tuple(server) if server else None, scope.get("scheme", "http"), host or b"", origin)


class KeptHostGuard:
    """FastMCP's Host/Origin guard in front of ``app``, its allowed verdicts remembered."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Sequence[str] | None = None,
        allowed_origins: Sequence[str] | None = None,
        limit: int = KEPT_LIMIT,
    ) -> None:
        self.app = app
        self.limit = limit
        self.guard = HostOriginGuardMiddleware(
            self._allowed,
            allowed_hosts=allowed_hosts,
            allowed_origins=allowed_origins,
            mode="auto",
        )
        self.kept: set[_Key] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _key(scope) in self.kept:
            await self.app(scope, receive, send)
            return
        await self.guard(scope, receive, send)

    async def _allowed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastMCP's guard let this request through: remember its combination, then serve it."""
        if len(self.kept) < self.limit:
            self.kept.add(_key(scope))
        await self.app(scope, receive, send)
