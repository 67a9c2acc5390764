"""Where a loss object is used in training: the calls of a ``torch.nn`` loss class's
instance (``criterion(out, y)`` after ``criterion = nn.X(...)``), another value bound to the
same name (a loss picked by the configuration), and whether a call trains (reaches a
``.backward()``, not under ``torch.no_grad()``, not inside a module's ``forward``). Read by
the summed losses (:mod:`dp2ddp.model.losses`) and the valid-count means
(:mod:`dp2ddp.model.valid_means`)."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DP


def class_uses(m: SemanticModel, made: ast.Call) -> List[ast.Call]:
    """The calls of a loss object: ``criterion(out, y)`` after ``criterion = nn.X(...)`` (a
    name or ``self.attr`` bound once), or ``nn.X(...)(out, y)``. Read once per loss and
    module (the summed and the valid-mean losses both ask)."""
    known: Dict[int, List[ast.Call]] = m.cache.setdefault("losses:uses", {})  # type: ignore[assignment]
    got = known.get(id(made))
    if got is None:
        got = known[id(made)] = _find_class_uses(m, made)
    return got


def _find_class_uses(m: SemanticModel, made: ast.Call) -> List[ast.Call]:
    target = bound_to(m, made)
    if isinstance(target, ast.Call):
        return [target]
    if target is None:
        return []
    text = m.source(target)
    return [c for c in m.nodes(ast.Call) if isinstance(c.func, (ast.Name, ast.Attribute)) and m.source(c.func) == text]


def bound_to(m: SemanticModel, made: ast.Call) -> Optional[ast.AST]:
    """The name or attribute a loss object is bound to (through ``.to(device)``/``.cuda()``),
    or the call of ``nn.X(...)(out, y)``."""
    node: ast.AST = made
    parent = m.parent(node)
    while (isinstance(parent, ast.Attribute) and parent.attr in ("to", "cuda", "cpu")
           and isinstance(m.parent(parent), ast.Call) and m.parent(parent).func is parent):
        node = m.parent(parent)
        parent = m.parent(node)
    if isinstance(parent, ast.Call) and parent.func is node:
        return parent
    if not (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1):
        return None
    target = parent.targets[0]
    return target if isinstance(target, (ast.Name, ast.Attribute)) else None


def shared_binding(m: SemanticModel, made: ast.Call) -> Optional[ast.AST]:
    """Another value bound to the same name or attribute as the loss object (a loss picked
    by the configuration: ``self.lossfn = nn.L1Loss()`` on one branch, a summed one on
    another): its first assignment."""
    target = bound_to(m, made)
    if not isinstance(target, (ast.Name, ast.Attribute)):
        return None
    text = m.source(target)
    for a in m.nodes(ast.Assign):
        if len(a.targets) == 1 and m.source(a.targets[0]) == text and not any(n is made for n in ast.walk(a.value)):
            value = a.value
            while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                   and value.func.attr in ("to", "cuda", "cpu")):
                value = value.func.value
            if (isinstance(value, ast.Call) and m.qualified_names(value.func) and m.qualified_names(value.func) <= DP
                    and value.args and m.source(value.args[0]) == text):
                continue  # ``criterion = nn.DataParallel(criterion)``: the same loss (the migration takes the wrap off)
            if m.source(value) != text:  # not ``criterion = criterion.cuda()``
                return a
    return None


def trains_here(m: SemanticModel, node: ast.AST) -> bool:
    """The function around ``node`` (or module-level code) reaches a ``.backward()`` — itself,
    through what it calls, or in a caller (a loss helper called from the training step).
    A module that calls ``backward`` nowhere (a module of losses, a snippet) may train
    anywhere: it counts as training."""
    if not any(isinstance(c.func, ast.Attribute) for c in m.calls_spelled("backward")):
        return True
    func = m.enclosing_function(node)
    scopes = [func] if func is not None else [m.tree]
    if func is not None:
        scopes += [m.enclosing_function(c) or m.tree for c in m.call_sites(func)]
        cls = m.enclosing_class(func)
        if cls is not None and m.is_method(func):
            # a method a base class calls as ``self._forward(...)`` (a template method: the base's
            # own is a stub), called where the base trains (open-reid's BaseTrainer.train)
            scopes += [m.enclosing_function(c) for c in _self_calls(m, cls, func.name)]
    for scope in scopes:
        calls = m.calls_in(scope) if scope is m.tree else m.reached_calls(scope)
        if any(isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in calls):
            return True
    return False


def _self_calls(m: SemanticModel, cls: ast.ClassDef, name: str) -> List[ast.Call]:
    """``self.<name>(...)`` in the methods of the classes that share ``cls``'s ``self``."""
    return [n for c in m.family(cls) for fn in m.methods(c).values() for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]


def in_forward(m: SemanticModel, node: ast.AST) -> bool:
    from dp2ddp.model.kinds import is_module_class

    func = m.enclosing_function(node)
    return func is not None and getattr(func, "name", "") == "forward" and is_module_class(m, m.enclosing_class(func))

