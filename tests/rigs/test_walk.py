"""``make walk`` (:mod:`codekit.walk`): the walk of a session id through the router counts
its stops and its returns by both rules, on a package whose answer is known, and the
router's own walk goes back up its call stack at most :data:`BACKS_BOUND` times."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from codekit.walk import ROUTER, Target, main, walk

#: The most returns by the call-stack rule (b) the router's walk may make.
BACKS_BOUND = 0

TOY = {
    "__init__.py": "",
    "box.py": """
        from dataclasses import dataclass


        @dataclass
        class Box:
            session: str
            size: int
        """,
    "a.py": """
        from toy import b
        from toy.box import Box
        from toy.c import Store


        class Entry:
            def __init__(self, store: Store) -> None:
                self.store = store

            def handle(self, box: Box) -> None:
                sid = box.session
                self.store.put(sid)
                b.relay(box, box.size)
                self.store.put(sid)
                b.unrelated(box.size)

                def done() -> None:
                    print(box)

                def idle() -> None:
                    print("idle")

                b.later(done, idle)


        def back(sid: str) -> None:
            _inner(sid)


        def _inner(sid: str) -> str:
            return sid
        """,
    "b.py": """
        from collections.abc import Callable

        from toy import a
        from toy.box import Box
        from toy.c import Store


        def relay(box: Box, size: int) -> None:
            a.back(box.session)
            Store().get(box)


        def unrelated(size: int) -> int:
            return size


        def later(done: Callable[[], None], idle: Callable[[], None]) -> None:
            idle()
            done()
        """,
    "c.py": """
        class Store:
            def put(self, sid: str) -> None:
                self._key(sid)

            def _key(self, sid: str) -> str:
                return "k:" + sid

            def get(self, box: object) -> None:
                return None
        """,
}


@pytest.fixture
def toy(tmp_path: Path) -> Target:
    package = tmp_path / "toy"
    package.mkdir()
    for name, text in TOY.items():
        (package / name).write_text(textwrap.dedent(text))
    return Target(tmp_path, "toy", "toy.a:Entry.handle", "box", frozenset({"toy.box.Box"}))


def test_a_walk_stops_at_each_call_that_receives_the_id_in_evaluation_order(toy: Target) -> None:
    stops = [(s.file, s.function, s.revisit, s.back) for s in walk(toy).stops]
    assert stops == [
        ("a.py", "Entry.handle", False, False),
        ("c.py", "Store.put", False, False),
        ("c.py", "Store._key", False, False),  # within its file: no return
        ("b.py", "relay", False, False),  # (box.size alone would not be a stop)
        ("a.py", "back", True, True),  # back up to the file below on the stack
        ("a.py", "_inner", False, False),
        ("c.py", "Store.get", True, False),  # visited, but no longer on the stack
        ("c.py", "Store.put", True, False),  # a call site again: a stop again
        ("b.py", "later", True, False),  # it receives a closure that captures box
        ("a.py", "Entry.handle.done", True, True),  # the callback (idle captures nothing)
    ]


def test_a_walk_counts_its_files_and_both_kinds_of_return(toy: Target) -> None:
    result = walk(toy)
    assert (len(result.stops), result.files, result.revisits, result.backs) == (
        10,
        ["a.py", "c.py", "b.py"],
        5,
        2,
    )
    assert [s.first for s in result.stops].count(False) == 1  # Store.put, walked once


def test_the_command_prints_the_stops_and_the_table(
    toy: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--root", str(toy.root), "--package", "toy", "--entry", toy.entry]
    assert main([*args, "--param", "box", "--carrier", "toy.box.Box"]) == 0
    out = capsys.readouterr().out
    assert " ab     a.py:back\n" in out
    assert "c.py:Store.put  (again)" in out
    assert out.splitlines()[-4:] == [
        "stops                                         10",
        "files                                          3",
        "returns (a): into a file visited before        5",
        "returns (b): into a file on the call stack     2",
    ]


def test_the_routers_walk_goes_back_up_its_call_stack_at_most_the_bound() -> None:
    result = walk(ROUTER)
    assert result.stops[0].function == "Sticky.route"
    # It reaches the session table, the forward and the re-home (the walk is not cut short).
    assert {"router/table.py", "router/forward.py", "router/move.py"} <= set(result.files)
    assert len(result.stops) > 40
    assert result.backs <= BACKS_BOUND, [
        (s.caller, f"{s.file}:{s.function}") for s in result.stops if s.back
    ]
