"""Watching a key ring directory and swapping the ring without a restart.

The watcher polls the directory's fingerprint (the ``..data`` target of a
Secret volume: one ``readlink`` per tick), never the file, because the kubelet
replaces the whole directory. A new version is parsed and validated before it
is adopted; a malformed, empty or half-written ring is logged and the good
ring stays in place. Logs name kids, never keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.keys.files import fingerprint, read_snapshot
from mcpfleet.keys.ring import KeyRing, KeyRingError

log = logging.getLogger("mcpfleet.keyring")

DEFAULT_POLL_INTERVAL = 0.2


class KeyRingWatcher:
    """Keeps ``codec`` on the newest valid ring found in ``directory``."""

    def __init__(
        self,
        directory: Path,
        codec: ReloadableCodec,
        *,
        interval: float = DEFAULT_POLL_INTERVAL,
        on_change: Callable[[KeyRing], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = directory
        self.codec = codec
        self.interval = interval
        self._on_change = on_change
        self._on_error = on_error
        self._on_result = on_result
        self._seen = fingerprint(directory)
        self.reload_errors = 0

    def check(self) -> bool:
        """Look once; adopt a new valid ring. Returns True if the ring changed."""
        current = fingerprint(self.directory)
        if current == self._seen:
            return False
        try:
            snap = read_snapshot(self.directory)
            ring = KeyRing.from_document(snap.document)
        except KeyRingError as exc:
            self._seen = current
            self.reload_errors += 1
            log.error(
                "key ring in %s not loaded, keeping kids %s: %s",
                self.directory,
                list(self.codec.kids),
                exc,
            )
            if self._on_error is not None:
                self._on_error(str(exc))
            self._result("error")
            return False
        self._seen = snap.fingerprint
        if ring == self.codec.ring:
            self._result("unchanged")
            return False
        old = self.codec.kids
        self.codec.swap(ring)
        log.info("key ring loaded: kids %s (%s), was %s", list(ring.kids), ring.phase, list(old))
        if self._on_change is not None:
            self._on_change(ring)
        self._result("loaded")
        return True

    def _result(self, result: str) -> None:
        """Report one look at a new version on disk: ``loaded``, ``unchanged`` or ``error``."""
        if self._on_result is not None:
            self._on_result(result)

    async def run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # the watcher must outlive any surprise
                log.exception("key ring watcher failed a check; retrying")
            await asyncio.sleep(self.interval)
