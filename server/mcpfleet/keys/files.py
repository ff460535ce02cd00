"""Reading and writing a key ring directory laid out like a kubelet Secret volume.

The kubelet writes a Secret volume as a timestamped directory, a ``..data``
symlink pointing at it, and one symlink per key through ``..data``; an update
writes a new timestamped directory and renames a fresh symlink over ``..data``,
so a reader that resolves ``..data`` once sees either the old or the new
files, never a mix. mcpfleet reads the ring the same way, and
``mcpfleet keys`` writes local directories the same way, so one loader serves
pods and local fleets alike. A plain directory holding ``keyring.json`` is
read too (a hand-made ring for a quick start).
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from mcpfleet.contract import KEYRING_FILE
from mcpfleet.keys.ring import MAX_DOCUMENT_BYTES, KeyRing, KeyRingError

DATA_LINK = "..data"


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of a ring directory: the document and what identifies it."""

    document: bytes
    fingerprint: str


def fingerprint(directory: Path) -> str:
    """A cheap identity of the ring's current version (no file contents read).

    For a Secret volume it is the ``..data`` target (a new one per update); for a
    plain directory, the file's inode, size and modification time.
    """
    try:
        return "link:" + os.readlink(directory / DATA_LINK)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"error:{exc.errno}"
    try:
        st = (directory / KEYRING_FILE).stat()
    except OSError as exc:
        return f"missing:{exc.errno}"
    return f"file:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def read_snapshot(directory: Path) -> Snapshot:
    """Read the ring document once, through one resolution of ``..data``.

    Raises KeyRingError when the directory or document is missing or unreadable.
    """
    if not directory.is_dir():
        raise KeyRingError(f"key ring directory {directory} does not exist")
    try:
        target = os.readlink(directory / DATA_LINK)
        path = directory / target / KEYRING_FILE
        mark = "link:" + target
    except FileNotFoundError:
        path = directory / KEYRING_FILE
        mark = ""
    except OSError as exc:
        raise KeyRingError(f"cannot resolve {directory / DATA_LINK}: {exc.strerror}") from None
    try:
        with path.open("rb") as fh:
            document = fh.read(MAX_DOCUMENT_BYTES + 1)
            st = os.fstat(fh.fileno())
    except FileNotFoundError:
        raise KeyRingError(f"no {KEYRING_FILE} in {directory}") from None
    except OSError as exc:
        raise KeyRingError(f"cannot read {path}: {exc.strerror}") from None
    if not mark:
        mark = f"file:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    return Snapshot(document=document, fingerprint=mark)


def read_ring(directory: Path) -> KeyRing:
    """Read and validate the ring in ``directory``; raise KeyRingError with the reason."""
    snap = read_snapshot(directory)
    try:
        return KeyRing.from_document(snap.document)
    except KeyRingError as exc:
        raise KeyRingError(f"{directory / KEYRING_FILE}: {exc}") from None


def write_ring(directory: Path, ring: KeyRing) -> None:
    """Publish ``ring`` into ``directory`` atomically, the way the kubelet updates a volume."""
    write_volume(directory, {KEYRING_FILE: ring.to_document()})


def write_volume(directory: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as a Secret-volume update: new timestamped dir, ``..data`` swap."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.") + secrets.token_hex(4)
    staged = directory / stamp
    staged.mkdir(mode=0o700)
    for name, content in files.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"invalid volume file name {name!r}")
        fd = os.open(staged / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
    try:
        previous: str | None = os.readlink(directory / DATA_LINK)
    except FileNotFoundError:
        previous = None
    tmp_link = directory / (DATA_LINK + "_tmp")
    tmp_link.unlink(missing_ok=True)
    os.symlink(stamp, tmp_link)
    os.replace(tmp_link, directory / DATA_LINK)
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            os.symlink(f"{DATA_LINK}/{name}", link)
    if previous and previous != stamp:
        old = directory / previous
        for child in old.iterdir():
            child.unlink()
        old.rmdir()
