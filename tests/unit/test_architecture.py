"""The architecture of docs/architecture.md holds, and its checks can fail.

The import contracts live in pyproject.toml (``[tool.importlinter]``) and
``make lint`` runs ``lint-imports``. Here they run once on the code as it is,
and once per contract on a copy of the packages with one import that breaks
it: a contract that a bad import does not break is a check that cannot fail.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: Each package under its source root: the product's two, and the example apps beside it.
PACKAGES = (
    ("server", "mcpfleet"),
    ("operator", "mcpfleet_operator"),
    ("server", "mcpfleet_examples"),
)
ROOTS = tuple(dict.fromkeys(root for root, _ in PACKAGES))


def contract_ids() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"] for contract in config["contracts"]}


def lint_imports(cwd: Path, *args: str, pythonpath: Path | None = None) -> tuple[int, str]:
    env = dict(os.environ)
    if pythonpath is not None:
        # Ahead of the editable install's finder: the copy is what gets analyzed.
        env["PYTHONPATH"] = os.pathsep.join(str(pythonpath / r) for r in ROOTS)
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def test_every_import_contract_is_kept_on_this_code() -> None:
    code, out = lint_imports(ROOT)
    assert code == 0, out
    assert f"Contracts: {len(contract_ids())} kept, 0 broken." in out, out


#: One import per contract that the contract must refuse: (file, line, contract id).
BAD_IMPORTS = [
    ("server/mcpfleet/router/decisions.py", "import mcpfleet.replica.gate", "router-replica"),
    ("server/mcpfleet/contract.py", "import mcpfleet.registry", "server-layers"),
    ("server/mcpfleet/guard.py", "import kubernetes", "kubernetes-in-operator"),
    ("server/mcpfleet/dev/booking.py", "from kopf import on", "kubernetes-in-operator"),
    ("server/mcpfleet/once/_redis.py", "import redis", "redis-in-redisconn"),
    ("server/mcpfleet/config/_types.py", "import mcpfleet_operator.api", "server-without-operator"),
    ("operator/mcpfleet_operator/rotation.py", "import kopf", "operator-pure-core"),
    ("operator/mcpfleet_operator/api.py", "import mcpfleet_operator.status", "operator-layers"),
    (
        "operator/mcpfleet_operator/runtime.py",
        "import mcpfleet.router.table",
        "operator-meets-server",
    ),
    # Of the commands, the operator's own may use the Redis flags, nothing else.
    (
        "operator/mcpfleet_operator/cli.py",
        "import mcpfleet.commands",
        "operator-meets-server",
    ),
    ("server/mcpfleet_examples/app.py", "from mcpfleet.guard import ask", "apps-use-public-api"),
    # The wheel holds the product: an app is named by a string, never imported.
    ("server/mcpfleet/dev/booking.py", "import mcpfleet_examples.app", "product-without-examples"),
    (
        "operator/mcpfleet_operator/api.py",
        "from mcpfleet_examples import app",
        "product-without-examples",
    ),
    ("server/mcpfleet/router/decisions.py", "from mcpfleet.router import replicas", "no-cycles"),
]


def test_every_contract_has_a_bad_import_that_breaks_it() -> None:
    assert {contract for _, _, contract in BAD_IMPORTS} == contract_ids()


@pytest.fixture
def packages_copy(tmp_path: Path) -> Path:
    for root, package in PACKAGES:
        shutil.copytree(
            ROOT / root / package,
            tmp_path / root / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(("path", "line", "contract"), BAD_IMPORTS)
def test_a_forbidden_import_breaks_its_contract(
    packages_copy: Path, path: str, line: str, contract: str
) -> None:
    code, out = lint_imports(packages_copy, "--contract", contract, pythonpath=packages_copy)
    assert code == 0 and "KEPT" in out, f"the unchanged copy must pass {contract}:\n{out}"

    module = packages_copy / path
    module.write_text(module.read_text() + f"\n{line}  # the import under test\n")
    code, out = lint_imports(packages_copy, "--contract", contract, pythonpath=packages_copy)
    assert code == 1, out
    assert "BROKEN" in out, out


# ------------------------------------------------------- only redisconn builds Redis clients
#
# The redis-in-redisconn contract lets eight modules import the redis package for
# its exception and client types (listed in pyproject.toml). Import contracts
# cannot tell an annotation from a constructor call; this check does: outside
# mcpfleet.redisconn, nothing from the redis package is called, except an
# exception class (raised or caught).


def redis_calls(source: str) -> list[str]:
    """The calls of anything from the redis package in ``source``, by dotted name."""
    tree = ast.parse(source)
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "redis":
                    bound.add(alias.asname or "redis")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            bound.update(alias.asname or alias.name for alias in node.names)
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        parts = []
        func: ast.expr = node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in bound:
            continue
        name = ".".join([func.id, *reversed(parts)])
        if not name.endswith(("Error", "Exception")):
            calls.append(name)
    return calls


def product_modules() -> list[Path]:
    return sorted(p for root, pkg in PACKAGES for p in (ROOT / root / pkg).rglob("*.py"))


def test_no_module_but_redisconn_calls_the_redis_package() -> None:
    redisconn = ROOT / "server" / "mcpfleet" / "redisconn"
    inside = [path for path in product_modules() if path.is_relative_to(redisconn)]
    assert redisconn / "_clients.py" in inside
    assert any(redis_calls(p.read_text()) for p in inside), "the check no longer sees its clients"
    found = {
        str(path.relative_to(ROOT)): calls
        for path in product_modules()
        if path not in inside and (calls := redis_calls(path.read_text()))
    }
    assert not found, f"Redis clients built outside mcpfleet.redisconn: {found}"


@pytest.mark.parametrize(
    "source",
    [
        "import redis\nclient = redis.Redis(host='x')\n",
        "import redis.asyncio as aioredis\nc = aioredis.from_url('redis://x')\n",
        "from redis.sentinel import Sentinel\ns = Sentinel([('x', 1)])\n",
        "from redis import asyncio\np = asyncio.ConnectionPool()\n",
    ],
)
def test_a_redis_client_built_elsewhere_is_seen(source: str) -> None:
    assert redis_calls(source)


def test_catching_or_raising_a_redis_error_is_no_client() -> None:
    source = (
        "import redis\nfrom redis.exceptions import RedisError\n"
        "def f(c: redis.Redis) -> None:\n"
        "    try:\n        c.ping()\n"
        "    except RedisError:\n        raise redis.ConnectionError('x')\n"
    )
    assert redis_calls(source) == []
