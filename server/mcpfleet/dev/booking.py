"""``mcpfleet demo``'s booking flow: book a flight through a fleet, show where each round lands."""

from __future__ import annotations

from collections.abc import Callable

from mcpfleet.fleetclient import Era, Trace, connect

__all__ = ["run_demo"]


async def run_demo(url: str, era: Era, out: Callable[[str], None] = print) -> str:
    """Book a flight through the fleet; print each round with the replica that served it."""
    trace = Trace()
    async with connect(url, era, trace) as client:
        out(f"connected ({era} era) to {url}")
        result = await client.call_tool("book_flight", {"destination": "Lisbon"})
    rounds = [r for r in trace.rounds if r.rpc in ("tools/call", "response")]
    for i, r in enumerate(rounds, 1):
        what = "tools/call" if r.rpc == "tools/call" else "elicitation answer"
        out(f"  round {i}: {what} -> HTTP {r.status} served by {r.replica}")
    text = str(result.data)
    out(f"result: {text}")
    return text
