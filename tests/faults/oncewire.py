"""Once-flow rounds on the wire, shared by the Redis and once fault tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from fleetkit.clients.wire import Answer, accept, modern_call
from mcpfleet.once import OUTCOME_UNKNOWN_CODE, RETRY_CODE


def count(effects: Path, order: str) -> int:
    """Side effects of ``order`` (lines written by finish), whichever replica ran them."""
    if not effects.exists():
        return 0
    return sum(1 for ln in effects.read_text().splitlines() if ln.startswith(f"{order} "))


def started(effects: Path, order: str) -> bool:
    return effects.exists() and f"start {order}" in effects.read_text().splitlines()


def ask(url: str, order: str, tool: str = "charge", **args: Any) -> str:
    """The flow's first round: the sealed state to answer its question with."""
    first = modern_call(url, tool, {"order": order, **args})
    assert first.result.get("resultType") == "input_required", first.body
    return str(first.result["requestState"])


def final(
    url: str, order: str, state: str, tool: str = "charge", timeout: float = 30, **args: Any
) -> Answer:
    with httpx.Client(timeout=timeout) as client:
        return modern_call(
            url,
            tool,
            {"order": order, **args},
            request_state=state,
            input_responses={"ok": accept(True)},
            client=client,
        )


def text(answer: Answer) -> str:
    content = answer.result.get("content") or [{}]
    return str(content[0].get("text"))


def charged(answer: Answer, order: str) -> bool:
    return answer.status == 200 and text(answer) == f"{order}: charged"


def retryable(answer: Answer) -> bool:
    err = answer.error
    return bool(err and err["code"] == RETRY_CODE and (err.get("data") or {}).get("retryable"))


def outcome_unknown(answer: Answer) -> bool:
    err = answer.error
    return bool(err and err["code"] == OUTCOME_UNKNOWN_CODE)
