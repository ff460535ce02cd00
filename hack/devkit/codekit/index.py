"""A package's sources, parsed and indexed by name, never imported.

:class:`Index` reads every module of a package under its source root with
:mod:`ast` and answers what a name means where it is written: a module's
functions and classes, its imports (re-exports followed), a class's methods
(its bases' included) and the types of its attributes, from class-level
annotations and from ``__init__`` (``self.a: T``, ``self.a = param`` with the
parameter's annotation, ``self.a = T(...)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


@dataclass(eq=False)
class Module:
    name: str
    #: The file, relative to the source root's package (``router/sticky.py``).
    file: str
    tree: ast.Module
    #: Local name -> the dotted name it was imported as.
    imports: dict[str, str] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, Class] = field(default_factory=dict)


@dataclass(eq=False)
class Function:
    module: Module
    qualname: str
    node: FuncNode
    owner: Class | None = None

    @property
    def decorators(self) -> set[str]:
        if isinstance(self.node, ast.Lambda):
            return set()
        return {ast.unparse(d) for d in self.node.decorator_list}


@dataclass(eq=False)
class Class:
    module: Module
    name: str
    node: ast.ClassDef
    methods: dict[str, Function] = field(default_factory=dict)
    #: Attribute -> the expression of its type (an annotation, or a constructor).
    attrs: dict[str, ast.expr] = field(default_factory=dict)

    @property
    def dotted(self) -> str:
        return f"{self.module.name}.{self.name}"


Symbol = Module | Class | Function


def _init_attrs(cls: Class, init: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    """The attribute types ``__init__`` gives: ``self.a: T``, ``self.a = p``, ``self.a = T()``."""
    params = {a.arg: a.annotation for a in init.args.args + init.args.kwonlyargs if a.annotation}
    for node in ast.walk(init):
        targets: list[ast.expr]
        if isinstance(node, ast.AnnAssign):
            targets, value, annotation = [node.target], node.value, node.annotation
        elif isinstance(node, ast.Assign):
            targets, value, annotation = node.targets, node.value, None
        else:
            continue
        for target in targets:
            if not (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                continue
            if annotation is not None:
                cls.attrs[target.attr] = annotation
            elif isinstance(value, ast.Name) and value.id in params:
                cls.attrs[target.attr] = params[value.id]
            elif isinstance(value, ast.Call):
                cls.attrs[target.attr] = value.func


class Index:
    """Every module of a package under a source root, parsed, with its names."""

    def __init__(self, root: Path, package: str) -> None:
        self.modules: dict[str, Module] = {}
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join(parts)
            file = path.relative_to(root / package).as_posix()
            module = Module(name, file, ast.parse(path.read_text(), str(path)))
            self.modules[name] = module
            self._read(module, is_package=path.name == "__init__.py")

    def _read(self, module: Module, *, is_package: bool) -> None:
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        module.imports[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        module.imports[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = module.name.split(".")
                    keep = len(here) - node.level + (1 if is_package else 0)
                    base = ".".join([*here[:keep], *([base] if base else [])])
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = Function(module, node.name, node)
            elif isinstance(node, ast.ClassDef):
                cls = Class(module, node.name, node)
                module.classes[node.name] = cls
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        method = Function(module, f"{node.name}.{item.name}", item, cls)
                        cls.methods[item.name] = method
                        if item.name == "__init__":
                            _init_attrs(cls, item)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        cls.attrs[item.target.id] = item.annotation

    def lookup(self, dotted: str, depth: int = 0) -> Symbol | None:
        """The module, class or function a dotted name names (through re-exports)."""
        if dotted in self.modules:
            return self.modules[dotted]
        parent, _, attr = dotted.rpartition(".")
        if parent in self.modules and depth < 20:
            return self.resolve(self.modules[parent], attr, depth + 1)
        return None

    def resolve(self, module: Module, name: str, depth: int = 0) -> Symbol | None:
        """What ``name`` means at the top level of ``module``."""
        if name in module.functions:
            return module.functions[name]
        if name in module.classes:
            return module.classes[name]
        target = module.imports.get(name)
        return None if target is None else self.lookup(target, depth)

    def type_of(self, module: Module, expr: ast.expr | None) -> Class | None:
        """The package's class a type expression names (the first one of a union)."""
        if expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return self.type_of(module, ast.parse(expr.value, mode="eval").body)
        if isinstance(expr, ast.BinOp):
            return self.type_of(module, expr.left) or self.type_of(module, expr.right)
        symbol: Symbol | None = None
        if isinstance(expr, ast.Name):
            symbol = self.resolve(module, expr.id)
        elif isinstance(expr, ast.Attribute):
            owner = self.type_module(module, expr.value)
            if owner is not None:
                symbol = self.resolve(owner, expr.attr)
        return symbol if isinstance(symbol, Class) else None

    def type_module(self, module: Module, expr: ast.expr) -> Module | None:
        if isinstance(expr, ast.Name):
            symbol = self.resolve(module, expr.id)
            return symbol if isinstance(symbol, Module) else None
        if isinstance(expr, ast.Attribute):
            owner = self.type_module(module, expr.value)
            if owner is not None:
                return self.modules.get(f"{owner.name}.{expr.attr}")
        return None

    def bases(self, cls: Class) -> Iterator[Class]:
        """``cls`` and its bases in the package, depth first."""
        yield cls
        for base in cls.node.bases:
            found = self.type_of(cls.module, base)
            if found is not None and found is not cls:
                yield from self.bases(found)

    def method(self, cls: Class, name: str) -> Function | None:
        for c in self.bases(cls):
            if name in c.methods:
                return c.methods[name]
        return None

    def attr_type(self, cls: Class, name: str) -> Class | None:
        for c in self.bases(cls):
            if name in c.attrs:
                return self.type_of(c.module, c.attrs[name])
        return None
