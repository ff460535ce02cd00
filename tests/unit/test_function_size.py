"""No function of the product is longer than a reader can hold at once.

Every module under ``server/mcpfleet`` and ``operator/mcpfleet_operator``, and
of the example apps beside them (``server/mcpfleet_examples``), is parsed; a
function (or method) whose text, from its ``def`` line to its last line
(docstring included, decorators not), runs over :data:`LIMIT` lines fails
the test, unless :data:`EXCEPTIONS` names it with the reason it stays whole. A
long function is split along its steps; what stays is a declarative table (a
list of flags, of metric declarations, of ACL rules), where splitting would
scatter one table over several functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    ROOT / "server" / "mcpfleet",
    ROOT / "operator" / "mcpfleet_operator",
    ROOT / "server" / "mcpfleet_examples",
)

#: The longest a function may be, in lines.
LIMIT = 60

#: ``(path from the repository root, qualified name)`` of each function allowed
#: past the limit, with why it stays whole.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # Declarative flag tables: one ``add_argument`` per flag, in --help's order.
    ("operator/mcpfleet_operator/cli.py", "add_parsers"): "the flag table of the operator",
    # Metric declarations: one metric (name, help, labels, buckets) per statement.
    ("server/mcpfleet/replica/metrics.py", "ReplicaMetrics.__init__"): "the replica's metrics",
    ("server/mcpfleet/router/metrics.py", "RouterMetrics.__init__"): "the router's metrics",
    ("operator/mcpfleet_operator/metrics.py", "OperatorMetrics.__init__"): "the operator's metrics",
    # An ACL table: the Redis commands and key patterns of each account, rule by rule.
    ("server/mcpfleet/contract.py", "RedisKeys.acl_rules"): "the fleet's Redis ACL rules",
}


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, length)`` of each function longer than ``limit``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    length = child.end_lineno - child.lineno + 1
                    if length > limit:
                        found.append((name, child.lineno, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def product_modules() -> list[Path]:
    return sorted(p for root in SOURCES for p in root.rglob("*.py"))


def test_no_function_is_over_the_limit_unless_named_with_its_reason() -> None:
    modules = product_modules()
    assert len(modules) > 50, f"the product's modules were not found: {SOURCES}"
    over = []
    for path in modules:
        where = path.relative_to(ROOT).as_posix()
        for name, line, length in long_functions(path.read_text(encoding="utf-8")):
            if (where, name) not in EXCEPTIONS:
                over.append(f"{where}:{line}: {name} is {length} lines (limit {LIMIT})")
    assert not over, (
        "functions over the limit: split them along their steps, or name them in"
        " EXCEPTIONS with the reason they stay whole:\n" + "\n".join(over)
    )


def test_every_exception_still_names_a_function_over_the_limit() -> None:
    """An exception whose function was split or renamed goes: the list stays the truth."""
    stale = []
    for (where, name), _reason in EXCEPTIONS.items():
        path = ROOT / where
        longs = {n for n, _, _ in long_functions(path.read_text())} if path.is_file() else set()
        if name not in longs:
            stale.append(f"{where}: {name}")
    assert not stale, f"exceptions naming no function over {LIMIT} lines: {stale}"


def test_the_check_sees_a_long_function_a_method_and_a_nested_one() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    source = (
        f"def short():\n    return 1\n\n"
        f"def long():\n{body}\n"
        f"class C:\n    async def method(self):\n{body.replace('    ', '        ')}\n"
        f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n"
    )
    found = {name: length for name, _, length in long_functions(source)}
    assert found == {
        "long": LIMIT + 1,
        "C.method": LIMIT + 1,
        "outer": LIMIT + 2,
        "outer.inner": LIMIT + 1,
    }
    assert long_functions(f"def exactly():\n{body[: body.rindex('    x')]}") == []
