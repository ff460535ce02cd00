"""What the router and the replica's gates read of a JSON-RPC body, one way (no I/O).

A body is parsed only after :func:`json_depth_exceeds` has bounded its nesting,
so no client can exhaust a parser's stack; :func:`is_initialize` and
:func:`is_request` read what the transport will read, ``\\u`` escapes included
(JSON lets a client spell a key or a method name with them, and the transport
decodes them), so a check made here cannot be stepped around by spelling.
"""

from __future__ import annotations

import json

__all__ = [
    "MAX_JSON_DEPTH",
    "is_initialize",
    "is_request",
    "json_depth_exceeds",
    "load",
    "may_be_escaped",
    "may_name",
    "method_of",
    "parses_as_json",
]

#: The deepest JSON nesting parsed here. Routing and the limits need only the top
#: level (object or batch) and each message's ``method``; JSON-RPC params nest far
#: less in practice. A body nested deeper is refused as a parse error before any
#: recursive parser sees it, so no body can exhaust a process's stack.
MAX_JSON_DEPTH = 128


def json_depth_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True if ``body`` opens more than ``limit`` nested arrays/objects at any point.

    A linear scan that skips string contents (and their escapes); it does not
    validate the JSON, only bounds how deep a parser would have to recurse.
    A body with no more than ``limit`` opening brackets in all cannot nest
    deeper, and is cleared by two counts in C without the scan (every MCP
    message the router sees: the scan costs 20-40 us a body in Python).
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    in_string = False
    escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


_DECODER = json.JSONDecoder()


def load(body: bytes) -> object:
    """``json.loads`` for a body already known not to nest past :data:`MAX_JSON_DEPTH`.

    A body that opens with ``{`` or ``[`` and no NUL second byte is the UTF-8 that
    ``json.loads`` would detect: it is decoded here and parsed by the decoder
    ``json.loads`` uses, without its encoding detection (a Python function per
    call); any other body goes through ``json.loads`` itself.
    """
    if json_depth_exceeds(body):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if body[:1] in _OPENERS and body[1:2] != b"\x00":
        return _DECODER.decode(body.decode("utf-8", "surrogatepass"))
    return json.loads(body)


_OPENERS = (b"{", b"[")


def parses_as_json(body: bytes) -> bool:
    try:
        load(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return True


def is_initialize(body: bytes) -> bool:
    """True if a POST body is a JSON-RPC ``initialize`` request (or a batch holding one)."""
    return any(isinstance(m, dict) and m.get("method") == "initialize" for m in _items(body))


def _items(body: bytes) -> list[object]:
    """The messages of ``body`` (one, or a batch's); none when it does not parse."""
    try:
        doc = load(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return []
    return doc if isinstance(doc, list) else [doc]


def may_be_escaped(body: bytes) -> bool:
    """Whether ``body`` holds a ``\\u`` escape: looked for only past a backslash, which
    ``memchr`` finds (a two-byte search costs about as much as a whole JSON key's)."""
    return b"\\" in body and b"\\u" in body


def is_request(body: bytes) -> bool:
    """True if ``body`` holds a JSON-RPC request: a message with a ``method`` and an
    ``id`` (not a notification, not an answer). Two byte checks decide a body without
    ``\\u`` escapes; one with them is parsed."""
    if not may_be_escaped(body):
        return b'"method"' in body and b'"id"' in body
    return any(isinstance(m, dict) and "method" in m and "id" in m for m in _items(body))


def method_of(body: bytes) -> str | None:
    """The ``method`` of a single message, or None (a batch, garbage, no method)."""
    items = _items(body)
    method = items[0].get("method") if len(items) == 1 and isinstance(items[0], dict) else None
    return method if isinstance(method, str) else None


def may_name(body: bytes, literal: bytes) -> bool:
    """False only when ``body`` cannot hold the string ``literal`` once parsed: it is
    not in the bytes and no ``\\u`` escape could spell it (a cheap pre-check)."""
    return literal in body or may_be_escaped(body)
