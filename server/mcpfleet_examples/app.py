"""The example app mcpfleet serves by default: guard tools that ask their users for input.

Every tool serves both protocol eras from one definition, written against
mcpfleet's public API (:mod:`mcpfleet.guard`): on 2026-07-28 it returns an
``InputRequiredResult`` and carries its progress in the sealed
``request_state``, so each round may land on any replica; on a handshake-era
session it calls ``ctx.elicit`` and pauses in the replica that owns the session.
The one-time actions (``book_flight``, ``confirm_purchase``) pass ``once=True``:
their final round runs once per flow, fleet-wide, however often it is replayed.
``create_task`` announces ``resources/updated`` for ``report://weekly`` to every
listener of the fleet (:func:`mcpfleet.publish_resource_updated`).

Run it with ``mcpfleet serve`` (the default ``--app``) or any FastMCP runner.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from mcp_types import InputRequiredResult
from pydantic import BaseModel, Field

from mcpfleet import Answers, Outcome, Question, ask_then, first_missing, publish_resource_updated

#: The app's name. `mcpfleet serve` replaces its request-state policy with one
#: over the fleet's shared key ring and one audience for every replica
#: (`--audience`), so the name need not be unique across a fleet.
app = FastMCP(
    "mcpfleet-example",
    instructions="Example guard tools: flight booking, meeting planner, confirmations, "
    "tag selection and task forms. Each tool asks the user for what it needs.",
)

SEAT_PRICES = {"economy": 180, "premium": 420, "business": 1150}
ROSTER = ["alice", "bob", "carol", "dave", "erin"]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
TAGS = ["urgent", "finance", "legal", "draft", "internal", "customer"]
WEEKLY_REPORT = "report://weekly"


def _reference(*parts: object) -> str:
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return digest[:8].upper()


def _stopped(outcome: Outcome, what: str) -> str:
    return f"{what} {outcome.status} at '{outcome.key}'; nothing was done."


# --- flight booking: three rounds -----------------------------------------------------


def _booking_questions(destination: str) -> list[Question]:
    return [
        Question("date", f"Which date do you want to fly to {destination}? (YYYY-MM-DD)", str),
        Question("seat", "Which seat class?", list(SEAT_PRICES)),
    ]


@app.tool
async def book_flight(
    destination: Annotated[str, Field(min_length=2, max_length=64)], ctx: Context
) -> str | InputRequiredResult:
    """Book a flight: asks for the date, the seat class, then a confirmation of the price."""

    def next_question(answers: Answers) -> Question | None:
        asked = first_missing(_booking_questions(destination))(answers)
        if asked is not None:
            return asked
        if "confirm" not in answers:
            price = SEAT_PRICES[answers["seat"]]
            return Question(
                "confirm",
                f"Confirm {answers['seat']} to {destination} on {answers['date']} for EUR {price}?",
                bool,
            )
        return None

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return _stopped(outcome, "Booking")
        answers = outcome.answers
        try:
            day = dt.date.fromisoformat(answers["date"])
        except ValueError:
            return f"Booking not made: {answers['date']!r} is not a date (YYYY-MM-DD)."
        if not answers["confirm"]:
            return "Booking not confirmed; nothing was booked."
        ref = _reference(destination, day.isoformat(), answers["seat"])
        return (
            f"Booked {answers['seat']} to {destination} on {day.isoformat()} "
            f"for EUR {SEAT_PRICES[answers['seat']]}. Reference {ref}."
        )

    # A booking is a one-time action: replaying the confirming round books nothing more.
    return await ask_then(ctx, next_question, finish, once=True)


# --- meeting planner: steps that depend on earlier answers ------------------------------


@app.tool
async def plan_meeting(
    topic: Annotated[str, Field(min_length=1, max_length=120)], ctx: Context
) -> str | InputRequiredResult:
    """Plan a meeting: attendees, length, day, and a break for meetings over an hour."""

    def next_question(answers: Answers) -> Question | None:
        if "attendees" not in answers:
            return Question("attendees", f"Who should attend '{topic}'?", [ROSTER])
        if "minutes" not in answers:
            return Question("minutes", "How many minutes should it last?", int)
        if "day" not in answers:
            return Question("day", "Which day?", WEEKDAYS)
        if answers["minutes"] > 60 and "break" not in answers:
            return Question("break", "It runs over an hour. Add a 10-minute break?", bool)
        return None

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return _stopped(outcome, "Meeting planning")
        a = outcome.answers
        if not a["attendees"]:
            return "No meeting planned: nobody was invited."
        if not 5 <= a["minutes"] <= 480:
            return f"No meeting planned: {a['minutes']} minutes is not between 5 and 480."
        extra = " with a 10-minute break" if a.get("break") else ""
        return (
            f"Planned '{topic}' on {a['day']} for {a['minutes']} minutes{extra} "
            f"with {', '.join(a['attendees'])}."
        )

    return await ask_then(ctx, next_question, finish)


# --- purchase confirmation: one yes/no ---------------------------------------------------


@app.tool
async def confirm_purchase(
    item: Annotated[str, Field(min_length=1, max_length=120)],
    amount_eur: Annotated[float, Field(gt=0, le=100_000)],
    ctx: Context,
) -> str | InputRequiredResult:
    """Ask the user to confirm a purchase before it is made."""

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return _stopped(outcome, "Purchase")
        if not outcome.answers["ok"]:
            return f"Purchase of {item} not confirmed; nothing was charged."
        return f"Purchased {item} for EUR {amount_eur:.2f}. Order {_reference(item, amount_eur)}."

    question = Question("ok", f"Buy {item} for EUR {amount_eur:.2f}?", bool)
    # A purchase happens once per confirmation, whichever replica a replay reaches.
    return await ask_then(ctx, first_missing([question]), finish, once=True)


# --- multi-select tags -------------------------------------------------------------------


@app.tool
async def tag_document(
    document: Annotated[str, Field(min_length=1, max_length=200)], ctx: Context
) -> str | InputRequiredResult:
    """Let the user pick any number of tags for a document."""

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return _stopped(outcome, "Tagging")
        tags = sorted(set(outcome.answers["tags"]))
        return (
            f"Tagged {document} with {', '.join(tags)}." if tags else f"{document} left untagged."
        )

    question = Question("tags", f"Tags for {document}?", [TAGS])
    return await ask_then(ctx, first_missing([question]), finish)


# --- structured form with defaults -------------------------------------------------------


class TaskForm(BaseModel):
    """The fields of a new task; every field but the title has a default."""

    title: str = Field(min_length=1, max_length=200, description="What needs doing")
    priority: Literal["low", "normal", "high"] = Field("normal", description="How urgent")
    due: str = Field("", description="Due date, YYYY-MM-DD, or empty")
    estimate_hours: int = Field(1, ge=0, le=1000, description="Estimated effort in hours")
    notify: bool = Field(True, description="Notify the assignee")


@app.tool
async def create_task(
    project: Annotated[str, Field(min_length=1, max_length=80)], ctx: Context
) -> str | InputRequiredResult:
    """Create a task in a project from a form the user fills in. The weekly report
    counts the tasks made, so a created task tells its listeners, on every replica,
    that ``report://weekly`` changed."""
    created: list[TaskForm] = []

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return _stopped(outcome, "Task creation")
        task = TaskForm.model_validate(outcome.answers["task"])
        created.append(task)
        due = f", due {task.due}" if task.due else ""
        notify = "notified" if task.notify else "not notified"
        return (
            f"Created {task.priority} task '{task.title}' in {project}{due}, "
            f"{task.estimate_hours}h, assignee {notify}."
        )

    question = Question("task", f"New task in {project}", TaskForm)
    answer = await ask_then(ctx, first_missing([question]), finish)
    if created:
        await publish_resource_updated(WEEKLY_REPORT)
    return answer


# --- a prompt and a resource that ask ----------------------------------------------------


@app.prompt
async def draft_email(recipient: str, ctx: Context) -> str | InputRequiredResult:
    """A prompt for drafting an email; asks which tone to use."""

    def finish(outcome: Outcome) -> str:
        tone = outcome.answers.get("tone", "friendly") if outcome.done else "friendly"
        return f"Write a {tone} email to {recipient}. Keep it clear and end with a next step."

    question = Question(
        "tone", f"Tone of the email to {recipient}?", ["formal", "friendly", "brief"]
    )
    return await ask_then(ctx, first_missing([question]), finish)


@app.resource(WEEKLY_REPORT)
async def weekly_report(ctx: Context) -> str | InputRequiredResult:
    """A weekly report; asks which team it is for."""

    def finish(outcome: Outcome) -> str:
        team = outcome.answers.get("team", "platform") if outcome.done else "platform"
        return f"Weekly report for the {team} team: 12 tasks closed, 3 opened."

    question = Question("team", "Report for which team?", ["platform", "product"])
    return await ask_then(ctx, first_missing([question]), finish)
