"""The key ring document, its validation, kids and rotation steps."""

from __future__ import annotations

import base64
import json

import pytest
from mcp.server.request_state import AESGCMRequestStateCodec

from mcpfleet.keys.codec import token_kid
from mcpfleet.keys.ring import KeyRing, KeyRingError, RingKey, compute_kid


def _doc(keys: list[dict[str, str]], phase: str = "stable", version: int = 1) -> bytes:
    return json.dumps({"version": version, "phase": phase, "keys": keys}).encode()


def _entry(secret: bytes, kid: str | None = None) -> dict[str, str]:
    text = base64.urlsafe_b64encode(secret).decode().rstrip("=")
    return {"kid": kid or compute_kid(secret), "secret": text, "created": "2026-11-30T00:00:00Z"}


def test_kid_is_the_one_mcps_codec_puts_in_every_token() -> None:
    for _ in range(5):
        key = RingKey.new()
        token = AESGCMRequestStateCodec([key.secret]).seal(b"payload")
        assert token_kid(token) == key.kid == compute_kid(key.secret)


def test_document_round_trips_and_keeps_order() -> None:
    ring = KeyRing.generate().stage()
    again = KeyRing.from_document(ring.to_document())
    assert again == ring
    assert again.kids == ring.kids
    assert again.phase == "staged"


def test_rotation_steps_move_keys_as_the_protocol_says() -> None:
    ring = KeyRing.generate()
    old = ring.kids[0]
    staged = ring.stage()
    assert staged.kids[0] == old and staged.phase == "staged"
    new = staged.kids[1]
    promoted = staged.promote()
    assert promoted.kids == (new, old)
    retired = promoted.retire()
    assert retired.kids == (new,) and retired.phase == "stable"
    assert staged.abort().kids == (old,)


@pytest.mark.parametrize(
    ("ring_step", "step"),
    [
        ("stable", "promote"),
        ("stable", "retire"),
        ("staged", "stage"),
        ("promoted", "stage"),
        ("promoted", "abort"),
        ("staged", "retire"),
    ],
)
def test_out_of_order_steps_are_refused(ring_step: str, step: str) -> None:
    ring = KeyRing.generate()
    if ring_step in ("staged", "promoted"):
        ring = ring.stage()
    if ring_step == "promoted":
        ring = ring.promote()
    with pytest.raises(KeyRingError, match=step):
        getattr(ring, step)()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b'{"version": 1, "keys": [', "not valid JSON"),
        (b"[]", "JSON object"),
        (_doc([], version=1), "non-empty 'keys'"),
        (_doc([_entry(b"k" * 32)], version=2), "unsupported key ring version"),
        (_doc([{"kid": "00", "secret": "!!!"}]), "base64url"),
        (_doc([_entry(b"short")]), "at least 32 bytes"),
        (_doc([_entry(b"a" * 32, kid="deadbeef")]), "corrupt"),
        (_doc([_entry(b"a" * 32), _entry(b"a" * 32)], phase="staged"), "same key twice"),
        (_doc([_entry(b"a" * 32), _entry(b"b" * 32)], phase="stable"), "holds 1 key"),
        (_doc([_entry(b"a" * 32)], phase="spinning"), "phase must be one of"),
        (_doc([_entry(bytes([i]) * 32) for i in range(3)], phase="staged"), "at most 2"),
    ],
)
def test_invalid_documents_are_refused_with_a_clear_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(KeyRingError, match=reason):
        KeyRing.from_document(raw)


def test_errors_and_reprs_never_contain_key_material() -> None:
    secret = b"S" * 40
    encoded = _entry(secret)["secret"]
    ring = KeyRing.from_document(_doc([_entry(secret)]))
    for text in (repr(ring), str(ring), repr(ring.keys[0])):
        assert encoded not in text and "SSSS" not in text
    with pytest.raises(KeyRingError) as err:
        KeyRing.from_document(_doc([_entry(secret, kid="00000000")]))
    assert encoded not in str(err.value)
    truncated = _doc([_entry(secret)])[:-20]
    with pytest.raises(KeyRingError) as err:
        KeyRing.from_document(truncated)
    assert encoded[:10] not in str(err.value)


def test_a_short_key_is_refused_when_made() -> None:
    with pytest.raises(KeyRingError, match="at least 32 bytes"):
        RingKey.new(b"x" * 31)
