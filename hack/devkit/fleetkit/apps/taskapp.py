"""A FastMCP app with MCP tasks (SEP-2663), written as for ``fastmcp run``, unchanged.

Replicas load it as ``--app fleetkit.apps.taskapp:app`` (the [tasks] extra:
``make venv-tasks``). It registers ``TasksExtension()`` as any author does;
the fleet replaces it with one on the fleet's queue. ``double`` answers
``2 * n`` after ``seconds``; ``effect`` appends ``start <tag> pid=<pid>`` to
the file named by ``$MCPFLEET_TEST_EFFECTS`` (``O_APPEND``: replicas never
interleave a line), waits ``seconds``, appends ``done <tag> pid=<pid>`` and
answers ``tag``: the tests count side effects, not answers. ``confirm`` is a
guard in a task: the task asks (``input_required``), a ``tasks/update``
answers it, and the next leg appends ``confirmed <tag>``: it returns its
question itself. ``plan`` asks two questions with mcpfleet's ``ask_then``
inside the task (each answered with a ``tasks/update``, each next leg on any
worker), then appends ``planned <tag> ...`` once.
``broken`` raises: a plain error (the task completes with ``isError``) or, with
``protocol``, an MCP error (the engine fails the task). ``blob`` answers
``size`` characters of text (:func:`fleetkit.apps.blobtext.blob_text`).

With ``$TASKAPP_JWT_PUBLIC_KEY_FILE`` (and ``TASKAPP_JWT_ISSUER``,
``TASKAPP_JWT_AUDIENCE``, ``TASKAPP_BASE_URL``), the app checks bearer tokens
as deploy/own-app does (:mod:`fleetkit.clients.jwtkit` signs them), and ``whoami``
answers the caller's ``sub``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastmcp import Context, FastMCP
from fastmcp.server.dependencies import get_access_token
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
)

from fleetkit.apps.blobtext import blob_text
from mcpfleet import Outcome, Question, ask_then, first_missing

EFFECTS_ENV = "MCPFLEET_TEST_EFFECTS"


def _auth() -> Any:
    key_file = os.environ.get("TASKAPP_JWT_PUBLIC_KEY_FILE")
    if not key_file:
        return None
    from fastmcp.server.auth import RemoteAuthProvider
    from fastmcp.server.auth.providers.jwt import JWTVerifier
    from pydantic import AnyHttpUrl

    issuer = os.environ["TASKAPP_JWT_ISSUER"]
    with open(key_file, encoding="ascii") as fh:
        verifier = JWTVerifier(
            public_key=fh.read(),
            issuer=issuer,
            audience=os.environ["TASKAPP_JWT_AUDIENCE"],
            algorithm="RS256",
        )
    return RemoteAuthProvider(
        token_verifier=verifier,
        authorization_servers=[AnyHttpUrl(issuer)],
        base_url=os.environ["TASKAPP_BASE_URL"],
        resource_name="taskapp",
    )


app = FastMCP("mcpfleet-task-test", auth=_auth())
app.add_extension(TasksExtension())


def _effect(line: str) -> None:
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.tool(task=True)
async def double(n: int, seconds: float = 0.0) -> int:
    """Twice ``n``, after ``seconds``."""
    await asyncio.sleep(seconds)
    return 2 * n


@app.tool(task=True)
async def effect(tag: str, seconds: float = 0.0) -> str:
    """One counted side effect that takes ``seconds``."""
    _effect(f"start {tag} pid={os.getpid()}")
    await asyncio.sleep(seconds)
    _effect(f"done {tag} pid={os.getpid()}")
    return tag


@app.tool(task=True)
async def whoami(seconds: float = 0.0) -> str:
    """The caller's ``sub``, as the worker that ran the task sees it."""
    await asyncio.sleep(seconds)
    token = get_access_token()
    return str(token.claims.get("sub")) if token is not None else "anonymous"


@app.tool(task=True)
async def confirm(tag: str, ctx: Context) -> str | InputRequiredResult:
    """Asks whether to go on (the guard pattern: it returns the question), then answers."""
    answer = (ctx.input_responses or {}).get("ok")
    if answer is None:
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        ask = ElicitRequestFormParams(message=f"Go on with {tag}?", requested_schema=schema)
        return InputRequiredResult(input_requests={"ok": ElicitRequest(params=ask)})
    if (
        isinstance(answer, ElicitResult)
        and answer.action == "accept"
        and answer.content
        and answer.content.get("ok")
    ):
        _effect(f"confirmed {tag} pid={os.getpid()}")
        return f"{tag}: confirmed"
    return f"{tag}: declined"


@app.tool(task=True)
async def broken(protocol: bool = False) -> str:
    """Raises: an MCP error with ``protocol`` (a failed task), else a plain one (``isError``)."""
    if protocol:
        raise MCPError(code=INTERNAL_ERROR, message="broken on purpose")
    raise ValueError("broken on purpose")


@app.tool(task=True)
async def blob(size: int) -> str:
    """``size`` characters of text."""
    return blob_text(size)


_PLAN = first_missing(
    [Question("city", "Which city?", str), Question("nights", "How many nights?", int)]
)


@app.tool(task=True)
async def plan(tag: str, ctx: Context) -> str | InputRequiredResult:
    """Two questions with ``ask_then`` inside the task, then one counted effect."""

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return f"{tag}: {outcome.status} at {outcome.key}"
        city, nights = outcome.answers["city"], outcome.answers["nights"]
        _effect(f"planned {tag} {city} {nights} pid={os.getpid()}")
        return f"{tag}: {city} for {nights} nights"

    return await ask_then(ctx, _PLAN, finish)
