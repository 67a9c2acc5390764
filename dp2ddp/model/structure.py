"""Where a node stands in the tree: its parents, the statement and block that hold it,
its siblings, the function, class and loops around it; the module's top-level functions,
classes, main guard and import section."""

from __future__ import annotations

import ast
from functools import cached_property
from typing import Dict, Iterator, List, Optional, Tuple, Type

from dp2ddp.model.syntax import BLOCK_FIELDS, FUNCTIONS, LOOPS, is_docstring, is_main_test, only_imports, sort_nodes


class Structure:
    """The part of :class:`~dp2ddp.model.core.SemanticModel` that answers from the parents
    and the nodes by type the walk records (``parents``, ``_by_type``)."""

    def nodes(self, *types: Type[ast.AST]) -> List[ast.AST]:
        """Every node of these types, in source (pre-)order."""
        if len(types) == 1:
            t = types[0]
            if t not in self._sorted:
                self._sorted.add(t)
                if t in self._by_type:
                    sort_nodes(self._by_type[t])
            return self._by_type.get(t, [])
        out: List[ast.AST] = []
        for t in types:
            out.extend(self._by_type.get(t, ()))
        sort_nodes(out)
        return out

    def all_nodes(self, *types: Type[ast.AST]) -> Iterator[ast.AST]:
        """Every node of these types, in no particular order (no sort: for a question about
        the whole module, where :meth:`nodes` would sort for nothing)."""
        for t in types:
            yield from self._by_type.get(t, ())

    def parent(self, node: ast.AST) -> Optional[ast.AST]:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        p = self.parents.get(node)
        while p is not None:
            yield p
            p = self.parents.get(p)

    def contains(self, outer: ast.AST, inner: ast.AST) -> bool:
        if outer is inner:
            return True
        return any(a is outer for a in self.ancestors(inner))

    def statement_of(self, node: ast.AST) -> Optional[ast.stmt]:
        """The innermost statement that holds ``node`` (``node`` itself if it is one)."""
        cur: Optional[ast.AST] = node
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = self.parents.get(cur)
        return cur  # type: ignore[return-value]

    def block_of(self, stmt: ast.stmt) -> Optional[Tuple[ast.AST, str, List[ast.stmt]]]:
        """``(owner, field, statements)``: the block that holds ``stmt``."""
        owner = self.parents.get(stmt)
        if owner is None:
            return None
        for field in BLOCK_FIELDS + ("cases",):
            block = getattr(owner, field, None)
            if isinstance(block, list) and any(s is stmt for s in block):
                return owner, field, block
        return None

    def _split_block(self, stmt: ast.stmt) -> Tuple[List[ast.stmt], List[ast.stmt]]:
        """The statements of ``stmt``'s block before it and after it."""
        b = self.block_of(stmt)
        if b is None:
            return [], []
        block = b[2]
        i = next(i for i, s in enumerate(block) if s is stmt)
        return block[:i], block[i + 1 :]

    def siblings_after(self, stmt: ast.stmt) -> List[ast.stmt]:
        return self._split_block(stmt)[1]

    def siblings_before(self, stmt: ast.stmt) -> List[ast.stmt]:
        return self._split_block(stmt)[0]

    def top_statement(self, node: ast.AST) -> Optional[ast.stmt]:
        """The module-level statement that holds ``node``."""
        cur: Optional[ast.AST] = node
        while cur is not None:
            parent = self.parents.get(cur)
            if parent is self.tree:
                return cur  # type: ignore[return-value]
            cur = parent
        return None

    def enclosing_function(self, node: ast.AST) -> Optional[ast.AST]:
        """The ``def`` whose body holds ``node`` (``None`` at module or class level, or in a lambda)."""
        for a in self.ancestors(node):
            if isinstance(a, FUNCTIONS):
                if _in_header(a, node, self):
                    continue
                return a
            if isinstance(a, ast.Lambda):
                return None
        return None

    def enclosing_class(self, node: ast.AST) -> Optional[ast.ClassDef]:
        for a in self.ancestors(node):
            if isinstance(a, ast.ClassDef):
                return a
        return None

    def is_method(self, func: ast.AST) -> bool:
        return isinstance(self.parents.get(func), ast.ClassDef)

    def enclosing_loops(self, node: ast.AST, stop_at_function: bool = True) -> List[ast.AST]:
        """Loops whose *body* holds ``node``, innermost first."""
        out = []
        child = node
        for a in self.ancestors(node):
            if stop_at_function and isinstance(a, FUNCTIONS + (ast.Lambda, ast.ClassDef)):
                break
            if isinstance(a, LOOPS) and any(child is s for s in a.body):
                out.append(a)
            child = a
        return out

    def runs_before(self, node: ast.AST, later: ast.AST) -> bool:
        """``node`` runs before ``later`` wherever both run: in the same function (or both
        at module level), earlier in the source, and in no loop that also holds ``later``."""
        if self.enclosing_function(node) is not self.enclosing_function(later):
            return False
        if any(isinstance(a, LOOPS) and self.contains(a, later) for a in self.ancestors(node)):
            return False
        return (node.lineno, node.col_offset) < (later.lineno, later.col_offset)  # type: ignore[attr-defined]

    def branches(self, node: ast.AST, stop: Tuple[type, ...] = ()) -> List[Tuple[ast.AST, str]]:
        """The conditional constructs around ``node`` up to its function (or the first
        ancestor of a type in ``stop``), innermost first, each with the field of it that
        holds ``node``: ``(if_stmt, "body" | "orelse" | "test")``, ``(try_stmt, "body" |
        "handlers" | "orelse" | "finalbody")``, ``(ifexp, "body" | "orelse" | "test")``.
        The one home of "the conditions around a node": wraps, mixed scripts and loaders
        read it each with their own question."""
        out: List[Tuple[ast.AST, str]] = []
        child = node
        for a in self.ancestors(node):
            if isinstance(a, FUNCTIONS + (ast.Module, ast.Lambda, ast.ClassDef) + stop):
                break
            if isinstance(a, (ast.If, ast.IfExp, ast.Try)):
                where = next((f for f in ("test", "body", "orelse", "handlers", "finalbody")
                              if _holds(getattr(a, f, None), child)), "body")
                out.append((a, where))
            child = a
        return out

    # ------------------------------------------------------------------ module facts
    @cached_property
    def module_functions(self) -> Dict[str, ast.AST]:
        return {s.name: s for s in self.tree.body if isinstance(s, FUNCTIONS)}

    @cached_property
    def classes(self) -> Dict[str, ast.ClassDef]:
        return {s.name: s for s in self.tree.body if isinstance(s, ast.ClassDef)}

    def methods(self, cls: ast.ClassDef) -> Dict[str, ast.AST]:
        return {s.name: s for s in cls.body if isinstance(s, FUNCTIONS)}

    @cached_property
    def main_guard(self) -> Optional[ast.If]:
        for stmt in self.tree.body:
            if isinstance(stmt, ast.If) and is_main_test(stmt.test):
                return stmt
        return None

    @cached_property
    def top_import_end(self) -> Optional[ast.stmt]:
        """The last statement of the import section at the top of the module."""
        last = None
        for i, stmt in enumerate(self.tree.body):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                last = stmt
                continue
            if last is None and i == 0 and is_docstring(stmt):
                continue
            if _header_line(stmt):
                continue  # a string or ``__author__ = ...`` between the imports (ResNeXt's header)
            if isinstance(stmt, (ast.If, ast.Try)) and only_imports(stmt):
                last = stmt
                continue
            break
        return last


def _header_line(stmt: ast.stmt) -> bool:
    """A bare string, or a module dunder set to a constant (``__author__ = "..."``)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return True
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id.startswith("__") and stmt.targets[0].id.endswith("__")
            and isinstance(stmt.value, (ast.Constant, ast.List, ast.Tuple)))


def _in_header(func: ast.AST, node: ast.AST, model: Structure) -> bool:
    """``node`` is in a decorator, default, annotation or return annotation of ``func``."""
    cur = node
    for a in model.ancestors(node):
        if a is func:
            return not any(cur is s for s in func.body)  # type: ignore[attr-defined]
        cur = a
    return False


def _holds(field: object, child: ast.AST) -> bool:
    if isinstance(field, list):
        return any(c is child for c in field)
    return field is child
