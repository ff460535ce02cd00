"""``mcpfleet selftest URL``: what ``helm test`` can prove for any FastMCP app.

The chart's ``helm test`` Pod runs it against the router Service. It knows
neither the app's tools nor its users' credentials, so it proves what holds
for every app, in each era:

- an app open to anyone: a real MCP client initializes (the handshake era
  gets a session, pinned to one replica by the router) and lists the tools;
  every HTTP round answered below 400, by a replica the router names;
- an app that requires auth: a request without a token is refused with 401
  and a ``WWW-Authenticate: Bearer`` challenge, and the OAuth
  protected-resource metadata it points to (RFC 9728) is served through the
  router, naming the resource and at least one authorization server: the
  router reaches the replicas and the app's auth is wired. (A 401 without
  that metadata fails: a client could never learn where to get a token.)

Every line it prints names the era and what answered; exit status 0 means
both eras passed, 1 that one failed (and why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from mcpfleet.contract import REPLICA_HEADER, SESSION_HEADER
from mcpfleet.fleetclient import Era, Trace, connect

#: The protocol version each era's unauthenticated probe announces.
PROTOCOL: dict[Era, str] = {"modern": "2026-07-28", "handshake": "2025-11-25"}
_METADATA = re.compile(r'resource_metadata="([^"]+)"')


async def _probe(url: str, era: Era, timeout: float) -> httpx2.Response:
    """One request without credentials (a ping: it opens no session)."""
    async with httpx2.AsyncClient(timeout=timeout) as http:
        return await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 0, "method": "ping"},
            headers={
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": PROTOCOL[era],
            },
        )


def metadata_url(url: str, challenge: str) -> str:
    """Where the protected-resource metadata is, through the router at ``url``.

    The challenge names it under the app's public base URL, which a Pod in
    the cluster may not reach: its path is asked of the router instead.
    Without a ``resource_metadata`` parameter, RFC 9728's well-known path.
    """
    found = _METADATA.search(challenge)
    base = urlsplit(url)
    if found:
        path = urlsplit(found.group(1)).path
    else:
        path = "/.well-known/oauth-protected-resource" + base.path.rstrip("/")
    return urlunsplit((base.scheme, base.netloc, path, "", ""))


async def check_auth(url: str, era: Era, refused: httpx2.Response, timeout: float) -> str:
    """The 401's challenge and the metadata it points to; returns a line, raises on failure."""
    challenge = refused.headers.get("www-authenticate", "")
    if not challenge.lower().startswith("bearer"):
        raise RuntimeError(f"401 without a Bearer challenge (WWW-Authenticate: {challenge!r})")
    where = metadata_url(url, challenge)
    async with httpx2.AsyncClient(timeout=timeout) as http:
        response = await http.get(where)
    if response.status_code != 200:
        raise RuntimeError(
            f"the protected-resource metadata {where} answered {response.status_code}"
        )
    try:
        metadata: Any = response.json()
    except json.JSONDecodeError:
        raise RuntimeError(f"the protected-resource metadata {where} is not JSON") from None
    servers = metadata.get("authorization_servers") if isinstance(metadata, dict) else None
    if not isinstance(metadata, dict) or not metadata.get("resource") or not servers:
        raise RuntimeError(f"{where} names no resource or no authorization_servers")
    replica = response.headers.get(REPLICA_HEADER) or refused.headers.get(REPLICA_HEADER) or "?"
    return (
        f"{era}: ok, auth required: 401 with a Bearer challenge; metadata of"
        f" {metadata['resource']} (authorization servers {', '.join(map(str, servers))})"
        f" from replica {replica}"
    )


async def check_era(url: str, era: Era, timeout: float = 30.0) -> str:
    """``era`` against ``url``; returns a line to print, raises on failure."""
    refused = await _probe(url, era, timeout)
    if refused.status_code == 401:
        return await check_auth(url, era, refused, timeout)
    trace = Trace()
    async with connect(url, era, trace, timeout=timeout) as client:
        names = sorted(t.name for t in await client.list_tools())
    bad = [r.status for r in trace.rounds if r.status >= 400]
    if bad:
        raise RuntimeError(f"HTTP {bad} in the {era} era")
    unnamed = [r.rpc for r in trace.rounds if not r.replica]
    if unnamed:
        raise RuntimeError(f"rounds {unnamed} answered without {REPLICA_HEADER} (not a replica?)")
    sessions = {r.session for r in trace.rounds if r.session}
    if era == "handshake" and len(sessions) != 1:
        raise RuntimeError(f"the handshake era made {len(sessions)} sessions ({SESSION_HEADER})")
    replicas = sorted(trace.replicas())
    if era == "handshake" and len(replicas) != 1:
        raise RuntimeError(f"one session reached several replicas: {replicas}")
    return (
        f"{era}: ok, initialize and tools/list in {len(trace.rounds)} HTTP rounds,"
        f" replicas {', '.join(replicas)}; {len(names)} tools"
    )


async def selftest(url: str, out: Callable[[str], None] = print) -> int:
    """Both eras against ``url``; 0 when both passed."""
    status = 0
    for era in ("modern", "handshake"):
        try:
            out(await check_era(url, era))
        except Exception as exc:
            out(f"{era}: FAILED: {type(exc).__name__}: {exc}")
            status = 1
    return status
