"""The router's response writes: a response's head goes out with its body, or alone
at the end of the event-loop turn; nothing is reordered or lost."""

from __future__ import annotations

import asyncio

from mcpfleet.router.h1server import _CoalescedWrites


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_a_head_and_the_body_written_in_one_turn_go_out_in_one_write() -> None:
    out = Recorder()
    writes = _CoalescedWrites(out, asyncio.get_running_loop())  # type: ignore[arg-type]
    writes.write(HEAD)
    writes.write(b"{}")
    assert out.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)  # the turn's end: nothing left to flush
    assert out.writes == [HEAD + b"{}"]


async def test_a_head_whose_body_is_not_ready_goes_out_at_the_end_of_the_turn() -> None:
    out = Recorder()
    writes = _CoalescedWrites(out, asyncio.get_running_loop())  # type: ignore[arg-type]
    writes.write(HEAD)
    assert out.writes == []
    await asyncio.sleep(0)
    assert out.writes == [HEAD]
    writes.write(b"data: 1\n\n")
    assert out.writes == [HEAD, b"data: 1\n\n"], "body chunks pass straight through"


async def test_closing_flushes_a_held_head_first_and_the_rest_passes_through() -> None:
    out = Recorder()
    writes = _CoalescedWrites(out, asyncio.get_running_loop())  # type: ignore[arg-type]
    writes.write(HEAD)
    writes.close()
    assert out.writes == [HEAD] and out.closed
    assert writes.get_extra_info("peername") == "info:peername"
