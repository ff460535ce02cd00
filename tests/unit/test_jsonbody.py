"""What is read of a JSON-RPC body: the byte pre-checks never disagree with the parse."""

from __future__ import annotations

import pytest

from mcpfleet.jsonbody import is_initialize, is_request, may_be_escaped, may_name, method_of

pytestmark = pytest.mark.unit

ESCAPED_INIT = b'{"jsonrpc":"2.0","id":1,"method":"\\u0069nitialize","params":{}}'
ESCAPED_KEY = b'{"jsonrpc":"2.0","id":1,"\\u006dethod":"tools/call","params":{}}'
ESCAPED_ID = b'{"jsonrpc":"2.0","\\u0069d":1,"method":"ping"}'


def test_a_method_or_key_spelled_with_escapes_is_read_as_the_transport_reads_it() -> None:
    assert is_initialize(ESCAPED_INIT)
    assert is_request(ESCAPED_INIT) and is_request(ESCAPED_KEY) and is_request(ESCAPED_ID)
    assert method_of(ESCAPED_KEY) == "tools/call" and method_of(ESCAPED_INIT) == "initialize"
    assert may_name(ESCAPED_INIT, b"initialize") and may_name(ESCAPED_KEY, b"tools/call")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', True),
        (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', False),
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', False),
        (b'{"jsonrpc":"2.0","method":"notifications/x","params":{"\\u0069d":1}}', False),
        (b'[{"jsonrpc":"2.0","\\u0069d":1,"method":"ping"}]', True),
        (b"\xff\\u", False),
        (b"[" * 200 + b"\\u" + b"]" * 200, False),
    ],
    ids=["request", "notification", "answer", "escaped-nested", "batch", "garbage", "deep"],
)
def test_a_request_has_a_method_and_an_id_at_its_top_level(body: bytes, expected: bool) -> None:
    assert is_request(body) is expected


def test_a_body_without_the_literal_or_an_escape_cannot_name_it() -> None:
    assert not may_name(b'{"method":"ping"}', b"tools/call")
    assert method_of(b"[]") is None and method_of(b'{"method":1}') is None


def test_an_escape_is_looked_for_past_a_backslash_and_found_as_the_two_bytes_were() -> None:
    assert not may_be_escaped(b'{"method":"tools/call","id":1}')
    assert not may_be_escaped(b'{"text":"a \\n b \\" c"}'), "backslashes, no \\u"
    assert may_be_escaped(b'{"\\u006dethod":"x"}')
    assert may_be_escaped(b'{"text":"\\\\u"}'), "an escaped backslash before u: a yes, safe"
