"""A team's own FastMCP app with OAuth bearer tokens, served by the mcpfleet fleet.

The app is a resource server in FastMCP's own terms: a
:class:`~fastmcp.server.auth.RemoteAuthProvider` advertising the authorization
server that issues its tokens (RFC 9728 protected resource metadata), over a
:class:`~fastmcp.server.auth.providers.jwt.JWTVerifier` that checks each token's
RS256 signature, issuer, audience and expiry against a public key read from a
file. Every replica of a fleet holds the same public key (mounted from a Secret),
so any replica verifies any user's token.

Configuration, from the environment (never a key in it, only a file's path):

``OWNAPP_JWT_PUBLIC_KEY_FILE``
    the PEM public key that verifies tokens (required);
``OWNAPP_JWT_ISSUER``, ``OWNAPP_JWT_AUDIENCE``
    the ``iss`` and ``aud`` every token must carry (required);
``OWNAPP_BASE_URL``
    the address clients reach the fleet by: the router's public URL, never a
    replica's, since the resource metadata and the 401's ``resource_metadata``
    link must lead back through the router (required);
``OWNAPP_AUTH_SERVER``
    the authorization server to advertise (default: the issuer).

Served as ``mcpfleet serve --app ownapp.server:mcp``. The app is built on first
use, so a missing setting fails the replica's start with one clear line.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Annotated, Any

from fastmcp import Context, FastMCP
from fastmcp.server.auth import RemoteAuthProvider
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.server.dependencies import get_access_token
from mcp_types import InputRequiredResult
from pydantic import AnyHttpUrl, Field

from mcpfleet import Outcome, Question, ask_then, first_missing

__all__ = ["ConfigError", "create_app"]

ENV_PUBLIC_KEY_FILE = "OWNAPP_JWT_PUBLIC_KEY_FILE"
ENV_ISSUER = "OWNAPP_JWT_ISSUER"
ENV_AUDIENCE = "OWNAPP_JWT_AUDIENCE"
ENV_BASE_URL = "OWNAPP_BASE_URL"
ENV_AUTH_SERVER = "OWNAPP_AUTH_SERVER"


class ConfigError(RuntimeError):
    """The app's environment is incomplete or names an unreadable key file."""


def _setting(env: dict[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"ownapp: {name} is not set")
    return value


def _public_key(path: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            pem = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"ownapp: cannot read {ENV_PUBLIC_KEY_FILE} {path!r}: {exc}") from None
    if "-----BEGIN PUBLIC KEY-----" not in pem:
        raise ConfigError(f"ownapp: {path!r} is not a PEM public key")
    return pem


def _principal() -> str:
    token = get_access_token()
    # The auth middleware refused every request without a valid token.
    assert token is not None
    subject: Any = token.claims.get("sub") or token.client_id
    return str(subject)


def create_app(env: dict[str, str] | None = None) -> FastMCP[Any]:
    """Build the app from ``env`` (default: the process environment)."""
    env = dict(os.environ) if env is None else env
    issuer = _setting(env, ENV_ISSUER)
    base_url = _setting(env, ENV_BASE_URL)
    verifier = JWTVerifier(
        public_key=_public_key(_setting(env, ENV_PUBLIC_KEY_FILE)),
        issuer=issuer,
        audience=_setting(env, ENV_AUDIENCE),
        algorithm="RS256",
    )
    auth = RemoteAuthProvider(
        token_verifier=verifier,
        authorization_servers=[AnyHttpUrl(env.get(ENV_AUTH_SERVER) or issuer)],
        base_url=base_url,
        resource_name="ownapp",
    )
    app: FastMCP[Any] = FastMCP(
        "ownapp", instructions="Orders for signed-in users, confirmed once.", auth=auth
    )
    orders: dict[str, int] = {}

    @app.tool
    async def whoami() -> str:
        """The signed-in user, as the fleet's replica that served this call sees them."""
        return f"signed in as {_principal()}"

    @app.tool
    async def place_order(
        item: Annotated[str, Field(min_length=1, max_length=80)],
        quantity: Annotated[int, Field(ge=1, le=100)],
        ctx: Context,
    ) -> str | InputRequiredResult:
        """Place an order after the user confirms it; a confirmed order is placed once.

        ``once=True``: replaying the confirming round, on any replica, returns the
        original answer instead of ordering again.
        """
        user = _principal()

        def finish(outcome: Outcome) -> str:
            if not (outcome.done and outcome.answers["confirm"]):
                return f"No order placed for {user}."
            orders[user] = orders.get(user, 0) + 1
            return f"Ordered {quantity} x {item} for {user}."

        question = Question("confirm", f"Order {quantity} x {item} for {user}?", bool)
        return await ask_then(ctx, first_missing([question]), finish, once=True)

    return app


@cache
def _default_app() -> FastMCP[Any]:
    return create_app()


def __getattr__(name: str) -> Any:
    # `mcp` is built on first use, from the environment the replica started with.
    if name == "mcp":
        return _default_app()
    raise AttributeError(f"module 'ownapp.server' has no attribute {name!r}")
