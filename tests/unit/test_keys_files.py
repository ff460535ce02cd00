"""The Secret-volume files (server/mcpfleet/keys/files.py): atomic publication and reading."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mcpfleet.contract import KEYRING_FILE
from mcpfleet.keys.files import fingerprint, read_ring, write_ring, write_volume
from mcpfleet.keys.ring import KeyRing, KeyRingError


def test_write_ring_lays_out_a_secret_volume(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    write_ring(tmp_path, ring)
    assert os.readlink(tmp_path / KEYRING_FILE) == f"..data/{KEYRING_FILE}"
    target = os.readlink(tmp_path / "..data")
    assert target.startswith("..") and (tmp_path / target / KEYRING_FILE).is_file()
    assert read_ring(tmp_path) == ring
    write_ring(tmp_path, ring.stage())
    timestamped = [p for p in tmp_path.iterdir() if p.name.startswith("..2")]
    assert len(timestamped) == 1, "the previous version is removed after the swap"


def test_a_reader_never_sees_a_mix_of_versions(tmp_path: Path) -> None:
    generations = [str(i).encode() * 8 for i in range(60)]
    write_volume(tmp_path, {"a": generations[0], "b": generations[0]})
    mixed: list[tuple[bytes, bytes]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                target = os.readlink(tmp_path / "..data")
                a = (tmp_path / target / "a").read_bytes()
                b = (tmp_path / target / "b").read_bytes()
            except FileNotFoundError:
                continue  # resolved an old version just before it was removed: a retry
            if a != b:
                mixed.append((a, b))

    thread = threading.Thread(target=reader)
    thread.start()
    for gen in generations[1:]:
        write_volume(tmp_path, {"a": gen, "b": gen})
    stop.set()
    thread.join()
    assert mixed == []


def test_read_ring_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(KeyRingError, match="does not exist"):
        read_ring(tmp_path / "missing")
    with pytest.raises(KeyRingError, match=r"no keyring\.json"):
        read_ring(tmp_path)
    (tmp_path / KEYRING_FILE).write_text("{not json")
    with pytest.raises(KeyRingError, match="not valid JSON"):
        read_ring(tmp_path)


def test_fingerprint_changes_with_every_publication(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    write_ring(tmp_path, ring)
    first = fingerprint(tmp_path)
    write_ring(tmp_path, ring)
    assert fingerprint(tmp_path) != first
