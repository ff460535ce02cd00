"""``make bench``'s wrk script speaks MCP as a real client does, checked on a real replica.

The bench's hot-path figures are only worth something if every request wrk
sends is a round the replica serves (never a fast rejection); the script
checks each answer and counts the rest as bad, which these tests prove both
ways.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchkit.loadgen import run_wrk
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    if shutil.which("wrk") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("wrk is not installed (hack/ensure-debs.sh bench installs it)")
        pytest.skip("wrk is not installed: bash hack/ensure-debs.sh bench")
    with local_fleet(Path(tmp_path_factory.mktemp("wrk")), FleetOptions(replicas=1)) as lf:
        yield lf


def test_modern_round_script_is_answered_input_required_by_a_real_replica(
    small_fleet: LocalFleet,
) -> None:
    direct = f"{small_fleet.members['replica-0'].url}/mcp"
    for url in (direct, small_fleet.url):
        res = run_wrk(url, connections=2, seconds=1)
        assert res.requests > 10
        assert (res.bad, res.socket_errors) == (0, 0)
        assert 0 < res.p(0.5) <= res.p(0.99)


def test_answers_that_are_not_the_expected_round_count_as_bad(small_fleet: LocalFleet) -> None:
    # /healthz is not the MCP endpoint: every answer lacks an InputRequiredResult.
    res = run_wrk(f"{small_fleet.members['replica-0'].url}/healthz", connections=1, seconds=1)
    assert res.requests > 0
    assert res.bad == res.requests


def test_limit_stops_after_that_many_responses(small_fleet: LocalFleet) -> None:
    res = run_wrk(small_fleet.url, connections=1, seconds=1, limit=7)
    assert res.requests == 7


async def test_sessions_held_with_a_pending_elicitation_answer_pings_and_finish(
    small_fleet: LocalFleet, tmp_path: Path
) -> None:
    """The bench's handshake sessions, and wrk's sticky script, against a real replica."""
    import aiohttp

    from benchkit.sessionbench import finish_elicitation, initialize, ping, start_elicitation

    url = small_fleet.url
    async with aiohttp.ClientSession() as http:
        held = [await initialize(http, url) for _ in range(3)]
        for h in held:
            await start_elicitation(http, url, h)
            assert h.stream is not None and h.elicitation_id is not None
            await ping(http, url, h)
        ids = tmp_path / "sessions.txt"
        ids.write_text("".join(f"{h.session}\n" for h in held))
        direct = f"{small_fleet.members['replica-0'].url}/mcp"
        for target in (url, direct):
            res = run_wrk(target, connections=1, seconds=1, mode="sticky", sessions_file=ids)
            assert res.requests > 10
            assert (res.bad, res.socket_errors) == (0, 0)
        assert [await finish_elicitation(http, url, h) for h in held] == [True] * 3
        # Deleted by finish_elicitation: the sticky script now counts every answer bad.
        res = run_wrk(url, connections=1, seconds=1, mode="sticky", sessions_file=ids)
        assert res.requests > 0 and res.bad == res.requests
