"""The reloadable codec: rotation semantics and tamper resistance."""

from __future__ import annotations

import pytest
from mcp.server.request_state import InvalidRequestState

from mcpfleet.keys.codec import ReloadableCodec, token_kid
from mcpfleet.keys.ring import KeyRing


def test_tokens_survive_every_rotation_step_until_retire() -> None:
    ring = KeyRing.generate()
    codec = ReloadableCodec(ring)
    old_token = codec.seal(b"sealed under old")
    staged = ring.stage()
    codec.swap(staged)
    assert token_kid(codec.seal(b"x")) == ring.kids[0], "staging must not seal with the new key"
    assert codec.unseal(old_token) == b"sealed under old"
    promoted = staged.promote()
    codec.swap(promoted)
    new_token = codec.seal(b"sealed under new")
    assert token_kid(new_token) == promoted.kids[0]
    assert codec.unseal(old_token) == b"sealed under old"
    codec.swap(promoted.retire())
    assert codec.unseal(new_token) == b"sealed under new"
    with pytest.raises(InvalidRequestState, match="unknown key"):
        codec.unseal(old_token)


def test_a_replica_that_only_staged_unseals_tokens_of_one_that_promoted() -> None:
    staged = KeyRing.generate().stage()
    slow, fast = ReloadableCodec(staged), ReloadableCodec(staged.promote())
    assert slow.unseal(fast.seal(b"a")) == b"a"
    assert fast.unseal(slow.seal(b"b")) == b"b"


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # tampered tag
        lambda t: t[: len(t) // 2],  # truncated
        lambda t: t[:10] + ("x" if t[10] != "x" else "y") + t[11:],  # tampered nonce
        lambda t: "v2" + t[2:],  # another format
        lambda t: "",
    ],
)
def test_tampered_or_truncated_tokens_are_rejected(mangle) -> None:  # type: ignore[no-untyped-def]
    seen: list[tuple[str, str]] = []
    codec = ReloadableCodec(KeyRing.generate(), observer=lambda e, d: seen.append((e, d)))
    token = codec.seal(b"payload")
    with pytest.raises(InvalidRequestState):
        codec.unseal(mangle(token))
    assert seen and seen[-1][0] == "reject"


def test_observer_counts_seals_and_unseals_by_kid() -> None:
    seen: list[tuple[str, str]] = []
    ring = KeyRing.generate()
    codec = ReloadableCodec(ring, observer=lambda e, d: seen.append((e, d)))
    codec.unseal(codec.seal(b"p"))
    assert seen == [("seal", ring.kids[0]), ("unseal", ring.kids[0])]
