"""A FastMCP author's plain ``pip install mcpfleet``: no kopf, no Kubernetes client.

The operator's dependencies are the ``[operator]`` extra. Proven on the built
wheel's metadata (what pip installs without extras), and on a replica that
serves an app in a process where ``kopf`` and ``kubernetes`` cannot be imported
at all; there ``mcpfleet operator`` says which extra to install.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.wire import modern_call
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_ONLY = ("kopf", "kubernetes")
#: Runs mcpfleet's command with the operator's packages made unimportable.
WITHOUT_OPERATOR = "\n".join(
    [
        "import sys",
        f"names = {OPERATOR_ONLY!r}",
        "for name in names: sys.modules[name] = None  # import raises ImportError",
        "from mcpfleet.cli import main",
        "code = main(sys.argv[1:])",
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in names and sys.modules[m])",
        "assert not leaked, leaked",
        "sys.exit(code)",
    ]
)


def _mcpfleet(*args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ}
    return subprocess.Popen(
        [sys.executable, "-c", WITHOUT_OPERATOR, *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,  # type: ignore[call-overload]
    )


@pytest.mark.timeout(300)
def test_the_wheel_requires_kopf_and_kubernetes_only_with_the_operator_extra(
    tmp_path: Path,
) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("mcpfleet-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            ln.split(":", 1)[1].strip()
            for ln in zf.read(meta).decode().splitlines()
            if ln.startswith("Requires-Dist:")
        ]
        points = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "operator = mcpfleet_operator.cli" in zf.read(points).decode()
    plain = [r for r in requires if "extra ==" not in r]
    names = {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() for r in plain}
    assert "fastmcp" in names and "redis" in names
    assert not names & set(OPERATOR_ONLY), plain
    extra = [r for r in requires if 'extra == "operator"' in r]
    assert {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0] for r in extra} == set(OPERATOR_ONLY)
    # MCP tasks (docs/tasks.md): FastMCP's own [tasks] extra, only with mcpfleet's.
    assert not [r for r in plain if "tasks" in r], plain
    tasks = [r.split(";")[0].replace(" ", "") for r in requires if 'extra == "tasks"' in r]
    assert tasks == ["fastmcp[tasks]<5,>=4.1.4"], tasks


@pytest.mark.timeout(120)
def test_a_replica_serves_an_app_where_kopf_and_kubernetes_cannot_be_imported(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    made = _mcpfleet("keys", "generate", str(keys))
    out = made.communicate(timeout=60)[0]
    assert made.returncode == 0, out
    port = free_port()
    replica = _mcpfleet(
        "serve",
        "--keys",
        str(keys),
        "--port",
        str(port),
        "--name",
        "plain-0",
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: (
                replica.poll() is None and httpx.get(f"{url}/readyz", timeout=1).status_code == 200
            ),
            timeout=60,
            what="the replica to be ready",
            retry_on=(httpx.HTTPError,),
        )
        answer = modern_call(f"{url}/mcp", "confirm_purchase", {"item": "tea", "amount_eur": 2})
        assert answer.result.get("resultType") == "input_required", json.dumps(answer.body)
    finally:
        if replica.poll() is None:
            os.killpg(replica.pid, signal.SIGINT)
        out = replica.communicate(timeout=30)[0]
    assert replica.returncode == 0, out


def test_the_operator_command_names_its_extra_where_it_is_missing() -> None:
    helped = _mcpfleet("--help")
    out = helped.communicate(timeout=60)[0]
    assert helped.returncode == 0 and "operator" in out and "rotate" in out, out
    refused = _mcpfleet("operator", "-A")
    out = refused.communicate(timeout=60)[0]
    assert refused.returncode == 2, out
    assert "pip install 'mcpfleet[operator]'" in out
