"""Project one Secret into a directory exactly as the kubelet writes a Secret volume.

There is no kubelet in the control-plane tier, yet the replicas under test
must read their key ring from a real Secret through the real API, with the
on-disk layout and the atomic swap they will meet in a pod. The layout (see
``pkg/volume/util/atomic_writer.go`` in Kubernetes)::

    DIR/..2026_11_30_03_21_17.123456789/KEY   the files, mode 0644 (defaultMode)
    DIR/..data -> ..2026_11_30_03_21_17.123456789
    DIR/KEY    -> ..data/KEY

An update writes a new timestamped directory, points a ``..data_tmp`` symlink
at it and renames that over ``..data`` (one atomic step), adds and removes the
per-key symlinks, then deletes the old directory. A reader that opens ``..data``
once and reads every file relative to it sees one version, never a mix.

The syncer watches the Secret (GET, then WATCH from its resourceVersion; a
410 Gone starts over with a fresh GET) with whatever client it is given, so
it needs only ``get`` and ``watch`` on that one Secret, as a kubelet would.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

DATA_DIR = "..data"
DATA_DIR_TMP = "..data_tmp"


def _timestamped_dir(target: Path) -> Path:
    """Create ``..YYYY_MM_DD_HH_MM_SS.NNNNNNNNN`` (UTC, like the kubelet) exclusively."""
    while True:
        ns = time.time_ns()
        stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime(ns // 1_000_000_000))
        path = target / f"..{stamp}.{ns % 1_000_000_000:09d}"
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            continue
        return path


def write_atomically(target: Path, payload: Mapping[str, bytes], *, mode: int = 0o644) -> bool:
    """Make ``target`` hold exactly ``payload`` (key -> bytes), kubelet-style.

    Returns False when the directory already held this payload (nothing written).
    """
    target.mkdir(parents=True, exist_ok=True)
    data_link = target / DATA_DIR
    old_dir_name = os.readlink(data_link) if data_link.is_symlink() else None
    if old_dir_name is not None and _current_payload(target / old_dir_name) == dict(payload):
        return False

    new_dir = _timestamped_dir(target)
    for key, value in payload.items():
        path = new_dir / key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.chmod(path, mode)  # the umask must not narrow defaultMode
    os.chmod(new_dir, 0o755)

    tmp_link = target / DATA_DIR_TMP
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    os.symlink(new_dir.name, tmp_link)
    os.rename(tmp_link, data_link)  # the one atomic step readers depend on

    for key in payload:
        user_link = target / key
        if not user_link.is_symlink():
            os.symlink(f"{DATA_DIR}/{key}", user_link)
    old_keys = set(_current_payload(target / old_dir_name)) if old_dir_name else set()
    for key in old_keys - set(payload):
        with contextlib.suppress(FileNotFoundError):
            (target / key).unlink()
    if old_dir_name is not None:
        _remove_tree(target / old_dir_name)
    return True


def _current_payload(directory: Path) -> dict[str, bytes]:
    try:
        return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}
    except FileNotFoundError:
        return {}


def _remove_tree(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        for p in directory.iterdir():
            p.unlink()
        directory.rmdir()


def read_snapshot(target: Path, *, attempts: int = 1000) -> dict[str, bytes]:
    """Every file of the volume, as ONE version: how a consumer reads it safely.

    Resolve ``..data``, read every file of that directory, then resolve
    ``..data`` again: if it still names the same directory, no swap happened
    during the read (the writer removes a directory only after swapping away
    from it), so the files are one version. Otherwise, or if a file vanished
    under us, read again. Bounded: a writer that swaps faster than a read
    completes, ``attempts`` times in a row, raises RuntimeError.
    """
    data_link = target / DATA_DIR
    for _ in range(attempts):
        try:
            before = os.readlink(data_link)
            directory = target / before
            result = {p.name: p.read_bytes() for p in directory.iterdir()}
            if os.readlink(data_link) == before:
                return result
        except FileNotFoundError:
            pass
    raise RuntimeError(f"{target}: no stable read of {DATA_DIR} in {attempts} attempts")


class SecretVolumeSyncer:
    """Keep ``directory`` equal to Secret ``namespace/name``, as a kubelet volume.

    :param api: an API client; a ServiceAccount client with get+watch on the one
        Secret is enough.
    :param default_mode: file mode, like the volume's ``defaultMode``.
    :param watch_timeout: server-side watch timeout; the watch is renewed from
        the last resourceVersion after it, and :meth:`stop` does not wait for it.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        name: str,
        directory: Path,
        *,
        default_mode: int = 0o644,
        watch_timeout: int = 300,
    ) -> None:
        self._core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self.directory = Path(directory)
        self.default_mode = default_mode
        self.watch_timeout = watch_timeout
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: How many times the directory was rewritten (tests read it).
        self.writes = 0
        #: The last error the loop hit (it retries; tests may assert on it).
        self.last_error: BaseException | None = None
        #: The resourceVersion the next watch starts from; None means GET first.
        self.resource_version: str | None = None
        #: How many times the Secret was read with a GET (start, and each 410).
        self.relists = 0

    # ---- life cycle

    def start(self, *, wait: float | None = 10.0) -> SecretVolumeSyncer:
        """Start the watch thread; by default wait until the first write is on disk."""
        self._thread = threading.Thread(
            target=self._run, name=f"secret-syncer-{self.namespace}/{self.name}", daemon=True
        )
        self._thread.start()
        if wait is not None and not self._synced.wait(wait):
            self.stop()
            raise TimeoutError(
                f"secret {self.namespace}/{self.name} not synced within {wait}s"
                f" (last error: {self.last_error!r})"
            )
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching: the blocked read is interrupted, the thread joins.

        ``Watch.stop()`` can only interrupt a read once the watch request has
        a response; one issued while the request is still in flight is lost.
        So keep interrupting until the thread is gone (polling, bounded).
        """
        self._stopping.set()
        thread, self._thread = self._thread, None
        deadline = time.monotonic() + timeout
        while thread is not None and thread.is_alive():
            with self._lock:
                if self._watch is not None:
                    self._watch.stop()
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{thread.name} did not stop within {timeout}s")
            thread.join(0.05)

    def __enter__(self) -> SecretVolumeSyncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the loop

    def _run(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch_once()
                backoff = 0.05
            except ApiException as exc:
                if self._stopping.is_set():
                    return
                if exc.status == 410:  # our resourceVersion is too old: start over
                    log.info("watch of %s/%s expired; re-reading", self.namespace, self.name)
                    self.resource_version = None
                    continue
                self._failed(exc)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                self._failed(exc)
            # Back off before retrying, but wake at once on stop().
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, 2.0)

    def _failed(self, exc: BaseException) -> None:
        self.last_error = exc
        log.warning("secret syncer %s/%s: %r", self.namespace, self.name, exc)

    def _relist(self) -> None:
        self.relists += 1
        # Raw JSON, the same shape the watch events carry (data is base64).
        response: Any = self._core.read_namespaced_secret(
            self.name, self.namespace, _preload_content=False
        )
        raw: dict[str, Any] = json.loads(response.read())
        self._apply(raw.get("data") or {})
        self.resource_version = raw["metadata"]["resourceVersion"]

    def _watch_once(self) -> None:
        watch = k8s_watch.Watch()
        with self._lock:
            if self._stopping.is_set():
                return
            self._watch = watch
        try:
            stream = watch.stream(
                self._core.list_namespaced_secret,
                self.namespace,
                field_selector=f"metadata.name={self.name}",
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout,
            )
            for event in stream:
                kind = event["type"]
                raw: dict[str, Any] = event["raw_object"]
                if kind in ("ADDED", "MODIFIED"):
                    self._apply(raw.get("data") or {})
                elif kind == "DELETED":
                    # The kubelet keeps serving the last content; so do we.
                    log.info("secret %s/%s deleted; keeping files", self.namespace, self.name)
                self.resource_version = raw["metadata"]["resourceVersion"]
                if self._stopping.is_set():
                    return
        finally:
            with self._lock:
                self._watch = None

    def _apply(self, data: Mapping[str, str]) -> None:
        payload = {k: base64.b64decode(v) for k, v in data.items()}
        if write_atomically(self.directory, payload, mode=self.default_mode):
            self.writes += 1
        self._synced.set()
