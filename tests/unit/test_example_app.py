"""The example app's guard tools, in memory, on both protocol eras."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from mcp_types import ElicitResult

from mcpfleet.fleetclient import default_answer
from mcpfleet_examples.app import app

ERAS = ["auto", "legacy"]


def _client(
    mode: str,
    action: str = "accept",
    answers: dict[str, Any] | None = None,
    asked: list[str] | None = None,
) -> Client[Any]:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        if asked is not None:
            asked.append(message)
        if action != "accept":
            return ElicitResult(action=action)  # type: ignore[arg-type]
        schema = params.requested_schema
        value = default_answer(message, schema)
        for needle, forced in (answers or {}).items():
            if needle in message:
                value = forced
        props = schema.get("properties", {})
        return response_type(value=value) if set(props) == {"value"} else response_type(**value)

    return Client(app, mode=mode, elicitation_handler=handler)


@pytest.mark.parametrize("mode", ERAS)
async def test_booking_asks_three_questions_and_books(mode: str) -> None:
    asked: list[str] = []
    async with _client(mode, asked=asked) as client:
        result = await client.call_tool("book_flight", {"destination": "Oslo"})
    assert [q.split()[0] for q in asked] == ["Which", "Which", "Confirm"]
    assert "EUR 180" in asked[2]
    text = str(result.data)
    assert text.startswith("Booked economy to Oslo on 2026-12-24 for EUR 180. Reference ")


@pytest.mark.parametrize("mode", ERAS)
async def test_meeting_planner_asks_for_a_break_only_for_long_meetings(mode: str) -> None:
    async with _client(mode, answers={"How many minutes": 90}) as client:
        long = await client.call_tool("plan_meeting", {"topic": "Roadmap"})
    assert "with a 10-minute break" in str(long.data)
    async with _client(mode, answers={"How many minutes": 30}) as client:
        short = await client.call_tool("plan_meeting", {"topic": "Sync"})
    assert "break" not in str(short.data)
    assert "for 30 minutes with alice, bob" in str(short.data)


@pytest.mark.parametrize("mode", ERAS)
async def test_confirmation_yes_and_no(mode: str) -> None:
    async with _client(mode) as client:
        yes = await client.call_tool("confirm_purchase", {"item": "lamp", "amount_eur": 20})
    assert str(yes.data).startswith("Purchased lamp for EUR 20.00. Order ")
    async with _client(mode, answers={"Buy lamp": False}) as client:
        no = await client.call_tool("confirm_purchase", {"item": "lamp", "amount_eur": 20})
    assert str(no.data) == "Purchase of lamp not confirmed; nothing was charged."


@pytest.mark.parametrize("mode", ERAS)
async def test_multi_select_and_form_with_defaults(mode: str) -> None:
    async with _client(mode, answers={"Tags for": ["legal", "urgent", "legal"]}) as client:
        tags = await client.call_tool("tag_document", {"document": "contract.pdf"})
        task = await client.call_tool("create_task", {"project": "infra"})
    assert str(tags.data) == "Tagged contract.pdf with legal, urgent."
    assert str(task.data) == ("Created normal task 'Demo task' in infra, 1h, assignee notified.")


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_declines_and_cancels_end_the_flow_cleanly(mode: str, action: str) -> None:
    async with _client(mode, action=action) as client:
        result = await client.call_tool("book_flight", {"destination": "Rome"})
        prompt = await client.get_prompt("draft_email", {"recipient": "bob"})
    status = "declined" if action == "decline" else "cancelled"
    assert str(result.data) == f"Booking {status} at 'date'; nothing was done."
    assert "friendly email to bob" in prompt.messages[0].content.text  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ERAS)
async def test_prompt_and_resource_ask_for_input(mode: str) -> None:
    async with _client(mode, answers={"Tone": "formal", "Report for": "product"}) as client:
        prompt = await client.get_prompt("draft_email", {"recipient": "ana"})
        report = await client.read_resource("report://weekly")
    assert "Write a formal email to ana." in prompt.messages[0].content.text  # type: ignore[union-attr]
    assert report[0].text.startswith("Weekly report for the product team")  # type: ignore[union-attr]


async def test_bad_answers_are_reported_not_crashed_on() -> None:
    async with _client("auto", answers={"Which date": "tomorrow"}) as client:
        result = await client.call_tool("book_flight", {"destination": "Oslo"})
    assert "is not a date" in str(result.data)
