"""Placements of a module away from its wrap.

Any statement of the module that places a value spelled as the wrapped one
(:func:`placed_anywhere`), a function that places every value it returns
(:func:`placed_by_maker`): only to keep a warning quiet (DDP171). A caller that places the
wrapper a function returns, too late for DDP (:func:`placed_by_caller`).
"""

from __future__ import annotations

import ast
from typing import Iterable, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.placement import placement_of


def placed_anywhere(m: SemanticModel, names: Iterable[str]) -> bool:
    """Some statement of the module places a value spelled as one of ``names`` (``model.to(args.device)``
    in ``main()`` before ``train(args, model)`` wraps it). By spelling, across functions: only
    to keep a warning quiet (DDP171), never to edit."""
    wanted = set(names)
    for s in m.nodes(ast.Expr, ast.Assign):
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted:
            return True
    return False


def placed_by_maker(m: SemanticModel, value: ast.AST) -> bool:
    """Every value ``value`` may hold is returned by a function (this module's or a project
    module's) that places what it returns (``def make(): model = Net(); if
    torch.cuda.is_available(): model.cuda(); return model``, few-shot-meta-baseline's
    ``models.make``, also through ``load()`` that returns what ``make()`` made). Only to keep
    a warning quiet (DDP171), never to edit."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.names import DP

    found = [(n, p) for n, p in origins(m, value) if not (isinstance(n, ast.Call) and m.qualified_names(n.func) & DP)]
    return bool(found) and all(not path and isinstance(node, ast.Call) and _maker_places(m, node, 0) for node, path in found)


def _maker_places(m: SemanticModel, call: ast.Call, depth: int) -> bool:
    """``call`` runs a function that places every value it returns (``None`` aside)."""
    from dp2ddp.model.project_defs import project_def

    func, fm = m.resolve_call(call), m
    if func is None and isinstance(call.func, (ast.Name, ast.Attribute)):
        got = project_def(m, call.func)
        func, fm = (got[1], got[0]) if got is not None else (None, m)
    if depth > 2 or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    returned = [r.value for r in ast.walk(func) if isinstance(r, ast.Return) and r.value is not None
                and not (isinstance(r.value, ast.Constant) and r.value.value is None)]
    placed = {fm.source(p) for s in ast.walk(func) if isinstance(s, (ast.Expr, ast.Assign))
              for p in [placement_of(fm, s)] if p is not None}

    def places(r: ast.AST) -> bool:
        if fm.source(r) in placed:
            return True
        if isinstance(r, ast.Call):
            return _maker_places(fm, r, depth + 1)
        if isinstance(r, ast.Name):
            _, bindings = fm.lookup(r.id, fm.scope_of(r))
            return bool(bindings) and all(b.kind == "assign" and isinstance(b.value, ast.Call)
                                          and _maker_places(fm, b.value, depth + 1) for b in bindings)
        return False

    return bool(returned) and all(places(r) for r in returned)


_PLACING = frozenset({"to", "cuda"})


def placed_by_caller(m: SemanticModel, stmt: ast.stmt, target: Optional[ast.AST]) -> Optional[str]:
    """Where a caller places the model a function returns after wrapping it: the wrap is in
    ``_build_model``, which returns the wrapper, and a project module calls
    ``self._build_model().to(self.device)`` (Autoformer's ``Exp_Basic.__init__``). Under DDP the
    wrapper must be built over a module already on this rank's device; a placement after it,
    on a device the caller chose for the one process of the original, comes too late (on a
    GPU the wrap raises). ``"path:line"`` (relative to this module's folder) or ``None``."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.project import project_modules

    func = m.enclosing_function(stmt)
    if func is None or target is None or not isinstance(target, ast.Name):
        return None
    returned = any(isinstance(n, ast.Return) and isinstance(n.value, ast.Name) and n.value.id == target.id
                   and m.enclosing_function(n) is func for n in ast.walk(func))
    if not returned or m.path in ("<string>", "<stdin>", "-") or not os.path.exists(m.path):
        return None
    name = func.name  # type: ignore[attr-defined]
    here = os.path.realpath(m.path)
    places = [(here, os.path.basename(m.path))] + [(real, rel) for real, (rel, _d) in project_modules(m.path).items()]
    for real, rel in places:
        pm = m if real == here else file_model(real)
        if pm is None:
            continue
        for call in pm.nodes(ast.Call):
            f = call.func
            if not (isinstance(f, ast.Attribute) and f.attr in _PLACING and isinstance(f.value, ast.Call)):
                continue
            if f.attr == "cuda" and not call.args and not call.keywords:
                continue  # the current device, the rank's once set_device ran: the wrap places it there first
            inner = f.value.func
            if (isinstance(inner, ast.Attribute) and inner.attr == name) or (isinstance(inner, ast.Name) and inner.id == name):
                return f"{rel}:{call.lineno}"
    return None
