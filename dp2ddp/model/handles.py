"""Handles: where a value is named, so that two mentions of it can be matched.

A handle is ``(scope, text)``: ``scope`` is the function that binds a local name, the
(root) class of a ``self.x`` attribute, or ``None`` for a module global; ``text`` is the
name, ``self.x`` or ``d["key"]`` as written.
"""

from __future__ import annotations

import ast
from typing import Optional, Tuple

from dp2ddp.model.core import SemanticModel

Handle = Tuple[Optional[ast.AST], str]


def handle_of(m: SemanticModel, expr: ast.AST) -> Optional[Handle]:
    if isinstance(expr, ast.Name):
        where, _ = m.lookup(expr.id, m.scope_of(expr))
        if where is not None and where.kind == "function":
            return (where.node, expr.id)
        return (None, expr.id)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        cls = m.enclosing_class(expr)
        return (m.root_class(cls), m.source(expr)) if cls is not None else None
    return None


def _subscript_handle(m: SemanticModel, expr: ast.AST) -> Optional[Handle]:
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, (ast.Name, ast.Attribute)):
        h = handle_of(m, expr.value)
        if h is not None:
            if isinstance(expr.slice, ast.Constant):
                return item_handle(m, h, expr.value, expr.slice.value)
            return (h[0], m.source(expr))
    return None


def item_handle(m: SemanticModel, h: Handle, container: ast.AST, key: object) -> Handle:
    """The handle of ``container[key]`` (a constant key, however it is quoted)."""
    return (h[0], f"{m.source(container)}[{key!r}]")


def expr_handle(m: SemanticModel, expr: ast.AST) -> Optional[Handle]:
    """:func:`handle_of`, also for ``loaders[i]`` (loaders kept in a list)."""
    return _subscript_handle(m, expr) if isinstance(expr, ast.Subscript) else handle_of(m, expr)
