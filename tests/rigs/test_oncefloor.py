"""The once floor's bare client: RESP as Redis reads it, a reply only when it is whole."""

from __future__ import annotations

import asyncio

from benchkit.oncefloor import COMMAND, _Bare, _resp


def test_a_command_is_encoded_as_a_resp_array_of_bulk_strings() -> None:
    assert _resp(("SET", "k", "vv")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n"
    assert _resp(COMMAND).startswith(b"*7\r\n$3\r\nSET\r\n")


def test_a_reply_resolves_the_waiter_only_once_whole() -> None:
    async def run() -> None:
        bare = _Bare()
        bare.waiter = asyncio.get_running_loop().create_future()
        bare.data_received(b"$5\r\nhel")
        assert not bare.waiter.done()
        bare.data_received(b"lo\r\n")
        assert bare.waiter.result() == b"$5\r\nhello\r\n" and bare.buf == b""
        bare.waiter = asyncio.get_running_loop().create_future()
        bare.data_received(b"$-1\r\n")  # nothing held: the claim's first answer
        assert bare.waiter.result() == b"$-1\r\n"

    asyncio.run(run())
