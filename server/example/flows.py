"""Asking a user a sequence of questions, on both protocol eras, from one description.

A tool describes its questions as a function of the answers so far
(``next_question(answers) -> Question | None``). :func:`ask` then runs it:

* on a modern (2026-07-28) connection, each call answers at most one question:
  it folds the client's answer into the answers carried in ``request_state``
  (sealed by the framework, so any replica may serve the next round) and
  returns an ``InputRequiredResult`` for the next question, or the final
  answers when none is left;
* on a handshake-era connection, it calls ``ctx.elicit`` for each question in
  turn, the tool paused in this process between them.

Declines and cancels end the flow with an :class:`Outcome` the tool reports,
never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastmcp import Context
from fastmcp.server.elicitation import (
    AcceptedElicitation,
    handle_elicit_accept,
    parse_elicit_response_type,
)
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

Answers = dict[str, Any]
_PENDING = "_pending"


@dataclass(frozen=True)
class Question:
    """One thing to ask: ``key`` names the answer, ``response_type`` as for ``ctx.elicit``."""

    key: str
    message: str
    response_type: Any


@dataclass(frozen=True)
class Outcome:
    """How a flow ended: ``done`` with all answers, or ``declined``/``cancelled`` at ``key``."""

    status: Literal["done", "declined", "cancelled"]
    answers: Answers
    key: str | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"


NextQuestion = Callable[[Answers], "Question | None"]


def is_modern(ctx: Context) -> bool:
    """True when this request negotiated the modern (stateless, guard) era."""
    rc = ctx.request_context
    return rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def _restore(ctx: Context) -> Answers:
    raw = ctx.request_state
    if raw is None:
        return {}
    # The framework unsealed and authenticated this; it is what a prior round wrote.
    state = json.loads(raw)
    if not isinstance(state, dict):
        raise ValueError("request state is not an object")
    return state


def _fold(ctx: Context, answers: Answers, next_question: NextQuestion) -> Outcome | None:
    """Fold the client's answer to the pending question into ``answers``."""
    pending = answers.pop(_PENDING, None)
    responses = ctx.input_responses
    if pending is None or not responses or pending not in responses:
        return None
    result = responses[pending]
    if not isinstance(result, ElicitResult):
        raise ValueError(f"expected an elicitation result for {pending!r}")
    if result.action != "accept":
        return Outcome(
            status="declined" if result.action == "decline" else "cancelled",
            answers=answers,
            key=pending,
        )
    question = next_question(answers)
    if question is None or question.key != pending:
        raise ValueError(f"answer for {pending!r} does not match the flow")
    config = parse_elicit_response_type(question.response_type)
    accepted = handle_elicit_accept(config, result.content)
    answers[pending] = _jsonable(accepted.data)
    return None


async def ask(ctx: Context, next_question: NextQuestion) -> Outcome | InputRequiredResult:
    """Run a question flow on whichever era this request negotiated."""
    if is_modern(ctx):
        answers = _restore(ctx)
        ended = _fold(ctx, answers, next_question)
        if ended is not None:
            return ended
        question = next_question(answers)
        if question is None:
            return Outcome(status="done", answers=answers)
        config = parse_elicit_response_type(question.response_type)
        request = ElicitRequest(
            params=ElicitRequestFormParams(message=question.message, requested_schema=config.schema)
        )
        state = json.dumps({**answers, _PENDING: question.key}, separators=(",", ":"))
        return InputRequiredResult(input_requests={question.key: request}, request_state=state)

    answers = {}
    while (question := next_question(answers)) is not None:
        result = await ctx.elicit(question.message, question.response_type)
        if not isinstance(result, AcceptedElicitation):
            status: Literal["declined", "cancelled"] = (
                "declined" if result.action == "decline" else "cancelled"
            )
            return Outcome(status=status, answers=answers, key=question.key)
        answers[question.key] = _jsonable(result.data)
    return Outcome(status="done", answers=answers)


def first_missing(questions: list[Question]) -> NextQuestion:
    """A flow that asks a fixed list of questions in order."""

    def next_question(answers: Answers) -> Question | None:
        return next((q for q in questions if q.key not in answers), None)

    return next_question
