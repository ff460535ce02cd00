"""The Quickstart's ``make run`` as a normal user on a machine without redis-server.

A copy of the tree, owned by ``nobody`` (uid 65534), in a mount namespace of its own
where redis-server and redis-sentinel are not installed: ``/usr/bin`` is replaced by
a directory of links to every program of the real one but those two (a file merely
not executable would still be found by bash's ``command -v``).
There, as that user, the real ``make run``: it names what it cannot install and
why, does not stop, and ``mcpfleet dev`` falls back to its embedded replica, which
answers both eras.

The copy's venv is made beforehand (pip installing the locked set as that user
would take minutes): this venv's own Python with the packages of the venv the tests run in
on its path and the copy's own source first, its ``mcpfleet`` script as pip writes
it, and its stamp newer than ``pyproject.toml``, so ``make`` takes it as made.
Where that Python lives under a directory others cannot enter (pyenv's under
``/root``), the namespace lays a tmpfs over that directory with only the Python's
own tree bound back in. Setting
the namespace up needs root: elsewhere the test skips with the reason, and with
``CI=true`` (which runs as root) it fails instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.wire import initialize_body, modern_call
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
#: The venv these tests run in (.venv, or .venv-latest under make test-latest): its
#: Python and its packages make the copy's venv.
VENV = Path(sys.prefix)
BASE = Path(sys.base_prefix)
BASE_PYTHON = BASE / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
HIDDEN = ("redis-server", "redis-sentinel")

pytestmark = pytest.mark.timeout(120)


def _unable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Quickstart-as-a-user test cannot run: {reason}")
    pytest.skip(reason)


def _require() -> None:
    if os.geteuid() != 0:
        _unable("needs root to make a mount namespace and run as another user")
    for tool in ("unshare", "setpriv", "make", "mount"):
        if shutil.which(tool) is None:
            _unable(f"{tool} is not installed")
    if VENV == BASE:
        _unable("the tests do not run in a venv (make venv, make test)")
    if not BASE_PYTHON.exists():
        _unable(f"this venv's Python is not at {BASE_PYTHON}")


def _site_packages() -> Path:
    (found,) = (VENV / "lib").glob("python3.*/site-packages")
    return found


def _copy_tree(dest: Path) -> None:
    """The tree's files as git sees them (committed or not), no venv, no caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _shared_site(tree: Path) -> Path:
    """Where this tree's venv packages are bound in the workspace, for ``nobody``."""
    return tree.parent / "site-packages"


def _premade_venv(tree: Path) -> None:
    venv = tree / ".venv"
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    # The copy's own packages first, then the packages this tree's venv installed
    # (their .pth files are not run: this tree's editable finder stays out).
    # The latter are reached through a bind mount in the workspace (see
    # _as_nobody_without_redis): this tree may lie under a directory nobody cannot
    # enter (a clone in a mktemp directory, or under /root).
    (site / "quickstart.pth").write_text(
        f"{tree / 'server'}\n{tree / 'operator'}\n{_shared_site(tree)}\n"
    )
    script = (VENV / "bin" / "mcpfleet").read_text().split("\n", 1)[1]
    (venv / "bin" / "mcpfleet").write_text(f"#!{venv / 'bin' / 'python'}\n{script}")
    (venv / "bin" / "mcpfleet").chmod(0o755)
    (venv / ".installed").touch()


def _closed_ancestor(path: Path) -> Path | None:
    """The outermost directory above ``path`` that other users cannot enter."""
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & 0o001:
            return parent
    return None


def _reach_python(spare: Path) -> str:
    """Shell lines that let any user run this venv's Python (see the module docstring)."""
    closed = _closed_ancestor(BASE)
    if closed is None:
        return "true"
    inner = closed / BASE.relative_to(closed)
    return (
        f"mount --bind {BASE} {spare} && mount -t tmpfs -o mode=755 tmpfs {closed}"
        f" && mkdir -p {inner} && mount --bind {spare} {inner}"
    )


@contextlib.contextmanager
def _as_nobody_without_redis(tree: Path, home: Path, command: str) -> Iterator[Run]:
    real, shown, spare = (home.parent / d for d in ("usr-bin", "usr-bin-shown", "python"))
    site = _shared_site(tree)
    for d in (real, shown, spare, site):
        d.mkdir()
    for program in Path("/usr/bin").iterdir():
        if program.name not in HIDDEN:
            (shown / program.name).symlink_to(real / program.name)
    hide = (
        f"mount --bind /usr/bin {real} && mount --bind {shown} /usr/bin"
        f" && mount --bind -o ro {_site_packages()} {site}"
    )
    script = (
        f"set -e; {hide}; {_reach_python(spare)}; "
        f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups -- "
        f"env -i PATH=/usr/local/bin:/usr/bin:/bin HOME={home} LANG=C.UTF-8 {command}"
    )
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        cwd=tree,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    run = Run(proc)
    try:
        yield run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        run.reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
        print("\n".join(run.lines))


class Run:
    """A running command and everything it printed."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def said(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in self.lines if (m := re.search(pattern, line))), None)

    def wait_said(self, pattern: str, timeout: float) -> re.Match[str]:
        def seen() -> bool:
            if self.said(pattern) is None and self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before /{pattern}/")
            return self.said(pattern) is not None

        wait_for(seen, timeout=timeout, what=f"the output to show /{pattern}/")
        found = self.said(pattern)
        assert found is not None
        return found


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A directory nobody can reach (pytest's own tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="mcpfleet-quickstart-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_make_run_as_a_normal_user_without_redis_server_names_what_is_missing_and_serves(
    workspace: Path,
) -> None:
    _require()
    tree, home, work = workspace / "mcpfleet", workspace / "home", workspace / "dev"
    _copy_tree(tree)
    _premade_venv(tree)
    home.mkdir()
    work.mkdir()
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(workspace)], check=True)
    port = free_port()
    command = f'make run DEV_ARGS="--port {port} --workdir {work}"'
    with _as_nobody_without_redis(tree, home, command) as run:
        served = run.wait_said(r"serving \S+ at (http://127\.0\.0\.1:\d+/mcp)", 60)
        url = served.group(1)
        assert url == f"http://127.0.0.1:{port}/mcp"
        # What it could not install, and why; then the fallback, not a stop.
        missing = run.said(r"cannot install (.*): installing Debian's packages needs root")
        assert missing is not None and set(HIDDEN) <= set(missing.group(1).split())
        assert run.said(r"Falling back to embedded mode") is not None
        assert run.said(r"run as root") is None

        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }

        def initialized() -> bool:
            answer = httpx.post(url, content=initialize_body("newcomer"), headers=headers)
            return answer.status_code == 200 and "mcp-session-id" in answer.headers

        wait_for(
            initialized, timeout=30, what="an initialize answered", retry_on=(httpx.HTTPError,)
        )
        round_ = modern_call(url, "confirm_purchase", {"item": "pen", "amount_eur": 2})
        assert round_.status == 200, round_.body
        # The replica runs as nobody, in the copy.
        assert run.proc.poll() is None
