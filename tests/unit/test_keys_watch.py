"""The key ring watcher (server/mcpfleet/keys/watch.py): good rings swap in, bad ones never do."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mcpfleet.contract import KEYRING_FILE
from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.keys.files import write_ring, write_volume
from mcpfleet.keys.ring import KeyRing
from mcpfleet.keys.watch import KeyRingWatcher


def test_watcher_swaps_good_rings_and_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = KeyRing.generate()
    write_ring(tmp_path, ring)
    codec = ReloadableCodec(ring)
    changes: list[KeyRing] = []
    watcher = KeyRingWatcher(tmp_path, codec, on_change=changes.append)
    assert watcher.check() is False

    staged = ring.stage()
    write_ring(tmp_path, staged)
    assert watcher.check() is True
    assert codec.kids == staged.kids and changes == [staged]

    secret_text = staged.to_document().decode()
    with caplog.at_level(logging.INFO, logger="mcpfleet.keyring"):
        write_volume(tmp_path, {KEYRING_FILE: b""})  # empty
        assert watcher.check() is False
        write_volume(tmp_path, {KEYRING_FILE: staged.to_document()[:50]})  # half-written
        assert watcher.check() is False
        write_volume(tmp_path, {KEYRING_FILE: b'{"version": 1, "keys": []}'})
        assert watcher.check() is False
    assert codec.kids == staged.kids, "a bad ring never replaces a good one"
    assert watcher.reload_errors == 3
    assert "keeping kids" in caplog.text
    for line in secret_text.splitlines():
        if '"secret"' in line:
            assert line.split('"')[3] not in caplog.text

    promoted = staged.promote()
    write_ring(tmp_path, promoted)
    assert watcher.check() is True
    assert codec.kids == promoted.kids
