"""How a value flows through a package's functions, read from their sources.

:class:`Flow` walks a function's body in evaluation order (a call's
arguments before the call, an assignment's value before its targets,
statements in order, every branch once) and tracks which values carry the
value followed (:class:`Carrier`): an instance of a carrier class, the value
itself (an attribute of a carrier named as one), or a closure that uses a
carrier of the function it was made in. A call that receives one is handed
to :meth:`Flow.arrive`, which says whether to walk the callee then; what
counts as a stop and as a return is :mod:`codekit.walk`'s.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from codekit.index import Class, FuncNode, Function, Index, Module, Symbol


@dataclass(frozen=True, eq=False)
class Carrier:
    """A value that carries the id: an instance of ``cls``, or the id itself (None)."""

    cls: Class | None


@dataclass(frozen=True, eq=False)
class Typed:
    """A value of a class of the package that does not carry the id."""

    cls: Class


@dataclass(frozen=True, eq=False)
class Closure:
    """A nested function, with the names of the function it was made in."""

    func: Function
    env: Env


@dataclass(frozen=True, eq=False)
class Ref:
    """A module, class or function of the package, named."""

    target: Symbol


@dataclass(frozen=True, eq=False)
class Bound:
    """A method, with the value it is called on (None: a static method)."""

    func: Function
    self_value: Value | None


@dataclass(frozen=True, eq=False)
class External:
    """A name from outside the package (``dataclasses.replace``)."""

    dotted: str


@dataclass(frozen=True, eq=False)
class Several:
    """A tuple's values, for unpacking."""

    items: tuple[Value | None, ...]


Value = Carrier | Typed | Closure | Ref | Bound | External | Several


class Env:
    """A function's names while the walk is inside it; a closure's reach its maker's."""

    def __init__(self, parent: Env | None = None) -> None:
        self.names: dict[str, Value] = {}
        self.parent = parent

    def get(self, name: str) -> Value | None:
        env: Env | None = self
        while env is not None:
            if name in env.names:
                return env.names[name]
            env = env.parent
        return None

    def set(self, name: str, value: Value | None) -> None:
        if value is None or isinstance(self.names.get(name), Carrier):
            return  # a carrier stays one
        self.names[name] = value


def _free_names(node: FuncNode) -> set[str]:
    """Names a function reads that it does not bind itself."""
    args = node.args
    bound = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    bound |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    body: list[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
    loaded: set[str] = set()
    declared: set[str] = set()
    for stmt in body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Name):
                (loaded if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
            elif isinstance(sub, ast.Nonlocal):
                declared.update(sub.names)
    return loaded - (bound - declared)


class Flow:
    """Where a value goes through the package's functions, from one function on.

    The calls that receive it are told to :meth:`arrive`, which says whether
    to go into the callee now (:meth:`enter`); the values in between are
    tracked as :data:`Value`.
    """

    def __init__(self, index: Index, carriers: frozenset[str], id_attrs: frozenset[str]) -> None:
        self.index = index
        self.carriers = carriers
        self.id_attrs = id_attrs

    def arrive(self, func: Function | Class) -> bool:
        """A call of ``func`` that receives the value: True to go into it now."""
        raise NotImplementedError

    def enter(self, func: Function, env: Env) -> None:
        """Walk the body of ``func`` (its names in ``env``)."""
        if isinstance(func.node, ast.Lambda):
            self.expr(func.node.body, env, func)
        else:
            self.block(func.node.body, env, func)

    # --- carriers

    def carries(self, value: Value | None, seen: frozenset[int] = frozenset()) -> bool:
        if isinstance(value, Carrier):
            return True
        if isinstance(value, Several):
            return any(self.carries(v, seen) for v in value.items)
        if isinstance(value, Bound):
            return self.carries(value.self_value, seen)
        if isinstance(value, Closure) and id(value) not in seen:
            inner = seen | {id(value)}
            return any(
                self.carries(value.env.get(name), inner) for name in _free_names(value.func.node)
            )
        return False

    def is_carrier(self, cls: Class | None) -> bool:
        return cls is not None and cls.dotted in self.carriers

    def result(self, module: Module, annotation: ast.expr | None, received: bool) -> Value | None:
        """The value a call returns, by the callee's return annotation."""
        if annotation is None:
            return None
        if (
            isinstance(annotation, ast.Subscript)
            and isinstance(annotation.value, ast.Name)
            and annotation.value.id == "tuple"
            and isinstance(annotation.slice, ast.Tuple)
        ):
            return Several(tuple(self.result(module, e, received) for e in annotation.slice.elts))
        members = _union(annotation)
        for member in members:
            cls = self.index.type_of(module, member)
            if received and self.is_carrier(cls):
                return Carrier(cls)
        cls = self.index.type_of(module, members[0])
        return None if cls is None else Typed(cls)

    def bind(
        self,
        func: Function,
        parent: Env | None,
        self_value: Value | None,
        args: Sequence[Value | None],
        kwargs: dict[str, Value | None],
    ) -> Env:
        env = Env(parent)
        params = [*func.node.args.posonlyargs, *func.node.args.args]
        decorators = func.decorators
        if func.owner is not None and "staticmethod" not in decorators and params:
            first, params = params[0], params[1:]
            if "classmethod" in decorators:
                env.set(first.arg, Ref(func.owner))
            else:
                env.set(first.arg, self_value or Typed(func.owner))
        for param, value in zip(params, args, strict=False):
            env.set(param.arg, value)
        for param in [*params, *func.node.args.kwonlyargs]:
            env.set(param.arg, kwargs.get(param.arg))
            typed = self.index.type_of(func.module, param.annotation)
            if typed is not None and param.arg not in env.names:
                env.set(param.arg, Typed(typed))
        return env

    def call(
        self,
        callee: Value | None,
        args: list[Value | None],
        kwargs: dict[str, Value | None],
    ) -> Value | None:
        received = any(self.carries(v) for v in [*args, *kwargs.values()])
        if isinstance(callee, External):
            if callee.dotted == "dataclasses.replace" and args and isinstance(args[0], Carrier):
                return args[0]
            return None
        if isinstance(callee, Ref) and isinstance(callee.target, Class):
            cls = callee.target
            if received and self.arrive(cls):
                made: Value = Carrier(cls) if self.is_carrier(cls) else Typed(cls)
                for name in ("__init__", "__post_init__"):
                    init = cls.methods.get(name)
                    if init is not None:
                        self.enter(init, self.bind(init, None, made, args, kwargs))
            return Carrier(cls) if received and self.is_carrier(cls) else Typed(cls)
        func: Function
        self_value: Value | None = None
        parent: Env | None = None
        if isinstance(callee, Bound):
            func, self_value = callee.func, callee.self_value
            received = received or self.carries(self_value)
        elif isinstance(callee, Ref) and isinstance(callee.target, Function):
            func = callee.target
        elif isinstance(callee, Closure):
            func, parent = callee.func, callee.env
            received = received or self.carries(callee)
        else:
            return None
        if received and self.arrive(func):
            self.enter(func, self.bind(func, parent, self_value, args, kwargs))
        returns = None if isinstance(func.node, ast.Lambda) else func.node.returns
        return self.result(func.module, returns, received)

    # --- expressions, in evaluation order

    def expr(self, node: ast.expr | None, env: Env, func: Function) -> Value | None:
        if node is None:
            return None
        if isinstance(node, ast.Name):
            return self.name(node.id, env, func.module)
        if isinstance(node, ast.Attribute):
            return self.attribute(self.expr(node.value, env, func), node.attr)
        if isinstance(node, ast.Call):
            callee = self.expr(node.func, env, func)
            args = [self.expr(a, env, func) for a in node.args]
            kwargs: dict[str, Value | None] = {}
            for kw in node.keywords:
                value = self.expr(kw.value, env, func)
                if kw.arg is not None:
                    kwargs[kw.arg] = value
            positional = [None if _starred(a) else v for a, v in zip(node.args, args, strict=True)]
            return self.call(callee, positional, kwargs)
        if isinstance(node, ast.Await | ast.NamedExpr | ast.Starred):
            value = self.expr(node.value, env, func)
            if isinstance(node, ast.NamedExpr):
                env.set(node.target.id, value)
            return value
        if isinstance(node, ast.Lambda):
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                self.expr(default, env, func)
            return Closure(Function(func.module, f"{func.qualname}.<lambda>", node), env)
        if isinstance(node, ast.Tuple | ast.List):
            return Several(tuple(self.expr(e, env, func) for e in node.elts))
        values = [self.expr(c, env, func) for c in _children(node)]
        if isinstance(node, ast.IfExp):  # the test is evaluated, either branch is the value
            values = values[1:]
        if isinstance(node, ast.IfExp | ast.BoolOp):
            return next((v for v in values if isinstance(v, Carrier)), None)
        return None

    def name(self, name: str, env: Env, module: Module) -> Value | None:
        value = env.get(name)
        if value is not None:
            return value
        symbol = self.index.resolve(module, name)
        if symbol is not None:
            return Ref(symbol)
        dotted = module.imports.get(name)
        return None if dotted is None else External(dotted)

    def attribute(self, base: Value | None, attr: str) -> Value | None:
        if isinstance(base, Ref) and isinstance(base.target, Module):
            symbol = self.index.resolve(base.target, attr) or self.index.lookup(
                f"{base.target.name}.{attr}"
            )
            return None if symbol is None else Ref(symbol)
        if isinstance(base, Ref) and isinstance(base.target, Class):
            method = self.index.method(base.target, attr)
            if method is None:
                return None
            if "classmethod" in method.decorators:
                return Bound(method, base)
            return Ref(method)
        if not isinstance(base, Carrier | Typed) or base.cls is None:
            return None
        cls = base.cls
        if isinstance(base, Carrier) and attr in self.id_attrs:
            return Carrier(None)
        method = self.index.method(cls, attr)
        if method is not None:
            if "property" in method.decorators:
                return self.result(method.module, _returns(method), False)
            return Bound(method, base)
        typed = self.index.attr_type(cls, attr)
        if typed is None:
            return None
        return (
            Carrier(typed) if isinstance(base, Carrier) and self.is_carrier(typed) else Typed(typed)
        )

    # --- statements, in order

    def block(self, body: Sequence[ast.stmt], env: Env, func: Function) -> None:
        for stmt in body:
            self.stmt(stmt, env, func)

    def stmt(self, node: ast.stmt, env: Env, func: Function) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                self.expr(decorator, env, func)
            nested = Function(func.module, f"{func.qualname}.<locals>.{node.name}", node)
            env.set(node.name, Closure(nested, env))
        elif isinstance(node, ast.ClassDef):
            return
        elif isinstance(node, ast.Assign):
            value = self.expr(node.value, env, func)
            for target in node.targets:
                self.assign(target, value, env, func)
        elif isinstance(node, ast.AnnAssign):
            value = self.expr(node.value, env, func)
            typed = self.index.type_of(func.module, node.annotation)
            self.assign(node.target, value or (Typed(typed) if typed else None), env, func)
        elif isinstance(node, ast.For | ast.AsyncFor):
            self.expr(node.iter, env, func)
            self.assign(node.target, None, env, func)
            self.block(node.body, env, func)
            self.block(node.orelse, env, func)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                value = self.expr(item.context_expr, env, func)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, env, func)
            self.block(node.body, env, func)
        elif isinstance(node, ast.Try | ast.TryStar):
            self.block(node.body, env, func)
            for handler in node.handlers:
                self.expr(handler.type, env, func)
                self.block(handler.body, env, func)
            self.block(node.orelse, env, func)
            self.block(node.finalbody, env, func)
        elif isinstance(node, ast.If | ast.While):
            self.expr(node.test, env, func)
            self.block(node.body, env, func)
            self.block(node.orelse, env, func)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child, env, func)
                elif isinstance(child, ast.stmt):
                    self.stmt(child, env, func)
                else:
                    for sub in ast.iter_child_nodes(child):
                        if isinstance(sub, ast.expr):
                            self.expr(sub, env, func)
                        elif isinstance(sub, ast.stmt):
                            self.stmt(sub, env, func)

    def assign(self, target: ast.expr, value: Value | None, env: Env, func: Function) -> None:
        if isinstance(target, ast.Name):
            env.set(target.id, value)
        elif isinstance(target, ast.Tuple | ast.List):
            items = value.items if isinstance(value, Several) else ()
            for i, elt in enumerate(target.elts):
                self.assign(elt, items[i] if i < len(items) else None, env, func)
        else:  # an attribute or a subscript: what it is stored into is read, not bound
            for child in _children(target):
                self.expr(child, env, func)


def _children(node: ast.AST) -> list[ast.expr]:
    """The expressions directly under ``node``, comprehensions' included, in order."""
    out: list[ast.expr] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            if not isinstance(child.ctx if hasattr(child, "ctx") else None, ast.Store):
                out.append(child)
        elif isinstance(child, ast.comprehension | ast.keyword | ast.FormattedValue):
            out.extend(_children(child))
    return out


def _starred(node: ast.expr) -> bool:
    return isinstance(node, ast.Starred)


def _union(annotation: ast.expr) -> list[ast.expr]:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return [*_union(annotation.left), *_union(annotation.right)]
    return [annotation]


def _returns(func: Function) -> ast.expr | None:
    return None if isinstance(func.node, ast.Lambda) else func.node.returns
