"""``mcpfleet selftest URL``: one modern-era and one handshake-era round through a fleet.

The chart's ``helm test`` Pod runs it against the router Service. With the
example app it completes a whole guard flow in each era (a booking on the
modern era, its answers sealed in ``request_state`` from round to round; a
meeting plan on the handshake era, each question an ``elicitation/create``
on the session's back-channel); with any other app it initializes a session
in each era and lists the tools. Every line it prints names the era, the
HTTP statuses and the replicas that answered; exit status 0 means both eras
worked, 1 that one failed (and why).
"""

from __future__ import annotations

from collections.abc import Callable

from mcpfleet.server.dev.demo import Era, Trace, connect

#: The example app's guard tools: (era, tool, arguments, how the result starts).
FLOWS: dict[Era, tuple[str, dict[str, str], str]] = {
    "modern": ("book_flight", {"destination": "Lisbon"}, "Booked "),
    "handshake": ("plan_meeting", {"topic": "selftest"}, "Planned "),
}


async def check_era(url: str, era: Era, timeout: float = 30.0) -> str:
    """One round trip in ``era``; returns a line to print, raises on failure."""
    trace = Trace()
    tool, arguments, expected = FLOWS[era]
    async with connect(url, era, trace, timeout=timeout) as client:
        names = {t.name for t in await client.list_tools()}
        if tool in names:
            result = await client.call_tool(tool, arguments)
            text = str(result.data)
            if not text.startswith(expected):
                raise RuntimeError(f"{tool} answered {text!r}")
            what = f"{tool}: {text}"
        else:
            what = f"tools/list: {len(names)} tools"
    bad = [r.status for r in trace.rounds if r.status >= 400]
    if bad:
        raise RuntimeError(f"HTTP {bad} in the {era} era")
    replicas = sorted({r.replica for r in trace.rounds if r.replica})
    return f"{era}: ok, {len(trace.rounds)} HTTP rounds, replicas {', '.join(replicas)}; {what}"


async def selftest(url: str, out: Callable[[str], None] = print) -> int:
    """Both eras against ``url``; 0 when both worked."""
    status = 0
    for era in ("modern", "handshake"):
        try:
            out(await check_era(url, era))
        except Exception as exc:
            out(f"{era}: FAILED: {type(exc).__name__}: {exc}")
            status = 1
    return status
