"""``make walk``: the walk of a session id from the router's entry point, and its returns.

A session id (the client's ``Mcp-Session-Id``) enters the router at
``mcpfleet.router.sticky:Sticky.route`` in the exchange ``x``. This module
reads the package's sources with :mod:`ast` (:mod:`codekit.index`; it
imports none of them), follows the id by data flow from there
(:mod:`codekit.flow`), and prints each stop of the walk, in order, and how
often it went back to a file it had been through.

What the walk follows:

- A *carrier* is a value that carries the id: the id itself (an attribute
  named in :attr:`Target.id_attrs`, ``x.session``, ``move.session``), an
  instance of a carrier class (:attr:`Target.carriers`: ``Exchange``,
  ``SessionRoute``, ``Move``, ``SessionKeys``), or a closure (a nested ``def`` or a
  ``lambda``) that uses a carrier of the function it is defined in.
- Carriers come from the entry's parameter :attr:`Target.param`, from the
  attributes of a carrier whose annotation is a carrier class
  (``move.route``, ``move.x``), from ``dataclasses.replace`` of a carrier,
  and from the result of a call that receives one when the callee's return
  annotation names a carrier class (an element of a ``tuple[...]`` for each
  name it is unpacked into). A value made without one (``SessionRoute(name)``)
  is none. A name, once a carrier in a function, stays one there.
- A *stop* is a call that receives a carrier, to a function, method or
  class of the package: as an argument, as the ``self`` of a method, or as a
  closure that captures one. Calls are resolved through the module's
  imports (re-exports followed), the classes' methods (bases included), and
  the types of attributes: class-level annotations and, in ``__init__``,
  ``self.a: T``, ``self.a = param`` (the parameter's annotation) and
  ``self.a = T(...)``; a parameter's annotation types it inside the callee.
- The walk is depth-first in evaluation order (a call's arguments before the
  call, an assignment's value before its targets, statements in order,
  every branch of an ``if``/``try`` once). The walk goes into a function at
  its first stop only: each function is walked once, and every later call of
  it is still a stop (a call site is a stop each time the walk meets it). The
  entry is the first stop. A closure is walked where it is called, not where
  it is defined; a class's stop walks its ``__init__``/``__post_init__``.

What counts as a *return* (both are counted, a stop being one or not by each):

a. **file visited before**: a stop whose function lives in another file than
   its caller's, in a file where an earlier stop of the walk was: every call
   from another file into ``table.py`` after the walk's first stop there
   counts, as does every call from ``table.py`` into ``contract.py`` after
   the first.
b. **file on the call stack**: a stop whose function lives in another file
   than its caller's, in a file one of the functions the walk is inside of
   (below the caller) lives in: the walk goes back up to a file it came
   through and has not returned from (``rehome.py`` -> ``move.py`` ->
   ``rehome.py``; a callback, ``move.py`` -> ``resend.py`` -> a closure of
   ``move.py``). Every (b) return is an (a) return.

``PYTHONPATH=hack/devkit .venv/bin/python -m codekit.walk`` walks the router
(``--root``, ``--entry``, ``--param`` another tree); ``--quiet`` prints the
table alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from codekit.flow import Carrier, Env, Flow
from codekit.index import Class, Function, Index, Module, Symbol

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Target:
    """What is walked: the sources, where the value enters, what carries it."""

    #: The source root (the folder that holds the package).
    root: Path
    package: str
    #: ``module:Qual.name`` of the function the value enters.
    entry: str
    #: The entry's parameter that holds the value (an instance of a carrier class).
    param: str
    #: Dotted names of the classes whose instances carry the value.
    carriers: frozenset[str]
    #: Attributes of a carrier that are the value itself.
    id_attrs: frozenset[str] = frozenset({"session"})


ROUTER = Target(
    root=ROOT / "server",
    package="mcpfleet",
    entry="mcpfleet.router.sticky:Sticky.route",
    param="x",
    carriers=frozenset(
        {
            "mcpfleet.router.exchange.Exchange",
            "mcpfleet.router.route.SessionRoute",
            "mcpfleet.router.move.Move",
            # The session's Redis keys, each holding the id.
            "mcpfleet.contract.SessionKeys",
        }
    ),
)


@dataclass(frozen=True)
class Stop:
    """One call of the walk that receives the id."""

    file: str
    function: str
    #: The caller's file (None for the entry).
    caller: str | None
    #: How many functions the walk is inside of (the entry: 0).
    depth: int
    #: The walk went into it here (its first stop).
    first: bool
    #: Rule (a): into another file than the caller's, visited before.
    revisit: bool
    #: Rule (b): into another file than the caller's, one the walk is still inside of.
    back: bool


@dataclass(frozen=True)
class Walk:
    entry: str
    stops: list[Stop]

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(s.file for s in self.stops))

    @property
    def revisits(self) -> int:
        return sum(s.revisit for s in self.stops)

    @property
    def backs(self) -> int:
        return sum(s.back for s in self.stops)


class Walker(Flow):
    """The walk: each call that receives the id is a :class:`Stop`, counted by both rules."""

    def __init__(self, index: Index, target: Target) -> None:
        super().__init__(index, target.carriers, target.id_attrs)
        self.stops: list[Stop] = []
        self.walked: set[int] = set()
        #: The files of the functions the walk is inside of, outermost first.
        self.stack: list[str] = []
        self.seen: set[str] = set()

    def arrive(self, func: Function | Class) -> bool:
        """A stop at ``func``; True when the walk goes into it now (its first stop)."""
        file = func.module.file
        caller = self.stack[-1] if self.stack else None
        crosses = caller is not None and caller != file
        key = id(func.node)
        first = key not in self.walked
        name = func.qualname if isinstance(func, Function) else func.name
        self.stops.append(
            Stop(
                file=file,
                function=name.replace(".<locals>", ""),
                caller=caller,
                depth=len(self.stack),
                first=first,
                revisit=crosses and file in self.seen,
                back=crosses and file in self.stack[:-1],
            )
        )
        self.seen.add(file)
        self.walked.add(key)
        return first

    def enter(self, func: Function, env: Env) -> None:
        self.stack.append(func.module.file)
        try:
            super().enter(func, env)
        finally:
            self.stack.pop()


def walk(target: Target = ROUTER) -> Walk:
    """The walk of the value from ``target``'s entry: every stop, in order."""
    index = Index(target.root, target.package)
    module_name, _, qualname = target.entry.partition(":")
    symbol: Symbol | None = index.modules[module_name]
    for part in qualname.split("."):
        if isinstance(symbol, Module):
            symbol = index.resolve(symbol, part)
        elif isinstance(symbol, Class):
            symbol = symbol.methods.get(part)
        else:
            symbol = None
    if not isinstance(symbol, Function):
        raise SystemExit(f"no function {target.entry}")
    walker = Walker(index, target)
    params = [a.arg for a in symbol.node.args.args]
    if target.param not in params:
        raise SystemExit(f"{target.entry} has no parameter {target.param}")
    annotation = next(a.annotation for a in symbol.node.args.args if a.arg == target.param)
    carrier = Carrier(index.type_of(symbol.module, annotation))
    walker.arrive(symbol)
    walker.enter(symbol, walker.bind(symbol, None, None, [], {target.param: carrier}))
    return Walk(target.entry, walker.stops)


def report(result: Walk, *, quiet: bool = False) -> str:
    lines = []
    if not quiet:
        lines.append(f"the walk from {result.entry} (a: file visited before; b: file on the stack)")
        for i, stop in enumerate(result.stops, 1):
            marks = ("a" if stop.revisit else " ") + ("b" if stop.back else " ")
            again = "" if stop.first else "  (again)"
            indent = "  " * stop.depth
            lines.append(f"{i:4} {marks} {indent}{stop.file}:{stop.function}{again}")
        lines.append("")
    rows = [
        ("stops", len(result.stops)),
        ("files", len(result.files)),
        ("returns (a): into a file visited before", result.revisits),
        ("returns (b): into a file on the call stack", result.backs),
    ]
    width = max(len(k) for k, _ in rows)
    lines += [f"{k:<{width}}  {v:>4}" for k, v in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codekit.walk", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--root", type=Path, default=ROUTER.root, help="the source root")
    parser.add_argument("--package", default=ROUTER.package)
    parser.add_argument("--entry", default=ROUTER.entry, help="module:Qual.name")
    parser.add_argument(
        "--param", default=ROUTER.param, help="the entry's parameter that carries the id"
    )
    parser.add_argument(
        "--carrier",
        action="append",
        help="dotted name of a class that carries the id (repeat; default: the router's)",
    )
    parser.add_argument("--quiet", action="store_true", help="the table alone")
    args = parser.parse_args(argv)
    target = Target(
        root=args.root,
        package=args.package,
        entry=args.entry,
        param=args.param,
        carriers=frozenset(args.carrier) if args.carrier else ROUTER.carriers,
    )
    print(report(walk(target), quiet=args.quiet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
