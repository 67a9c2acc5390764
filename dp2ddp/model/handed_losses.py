"""Losses the script hands to a project module's training code (``do_train(model, loader,
optimizer, loss_fn)``, the training in another module): the value the script passes for a
parameter that code calls where it trains, followed to what makes it — a closure a loss
factory returns (``make_loss(cfg)``, whose ``def loss_func`` calls ``triplet(feat, y)``),
a project loss class, a function — and read for a comparison of the batch's samples
(:mod:`dp2ddp.model.batch_coupling`). The module that trains never sees which loss it
is given; the script that hands it does."""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Set, Tuple

from dp2ddp.model.batch_coupling import coupling_when_called
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS, unplaced


class HandedLoss(NamedTuple):
    call: ast.Call  # the script's call into the project (``do_train(..., loss_fn)``)
    arg: ast.AST  # what it passes
    param: str  # the parameter that code calls
    rel: str  # the project module that calls it
    line: int  # where it is called there
    name: str  # the loss that couples the samples
    where: str  # ``layers/triplet_loss.py:12``: the comparison
    how: str


def _called_params(pm: SemanticModel, func: ast.AST, depth: int = 0) -> List[Tuple[str, int]]:
    """``(param, line)``: parameters of ``func`` it calls (in its body or a function nested
    in it) where the call trains (reaches a ``.backward()``), or hands on to another function
    of its module that does (``create_supervised_trainer(model, optimizer, loss_fn)``)."""
    from dp2ddp.model.loss_calls import trains_here

    params = set(pm.params(func))
    out: List[Tuple[str, int]] = []
    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in params and _binds_param(pm, node.func, func):
            if trains_here(pm, node):
                out.append((node.func.id, node.lineno))
            continue
        target = pm.resolve_call(node)
        if depth < 2 and isinstance(target, FUNCTIONS) and target is not func:
            for inner, line in _called_params(pm, target, depth + 1):
                arg = pm.argument_for(target, node, inner)
                if isinstance(arg, ast.Name) and arg.id in params and _binds_param(pm, arg, func):
                    out.append((arg.id, line))
    return out


def _binds_param(pm: SemanticModel, name: ast.Name, func: ast.AST) -> bool:
    """``name`` reads the parameter of ``func`` (itself, or from a nested function's closure)."""
    _, bindings = pm.lookup(name.id, pm.scope_of(name))
    a = func.args  # type: ignore[attr-defined]
    own = {id(p) for p in a.posonlyargs + a.args + a.kwonlyargs}
    return bool(bindings) and all(b.kind == "param" and id(b.node) in own for b in bindings)


def _made_by(m: SemanticModel, arg: ast.AST) -> List[Tuple[SemanticModel, ast.AST, str]]:
    """What ``arg`` (a value of the script) is when called: this module's function, a
    closure a project function returns, a project loss class's instance."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.project_defs import class_of_call, project_def, returned_callables

    out: List[Tuple[SemanticModel, ast.AST, str]] = []
    for node, path in origins(m, arg):
        if path:
            continue
        if isinstance(node, ast.Name):
            _, bindings = m.lookup(node.id, m.scope_of(node))
            out.extend((m, b.node, "") for b in bindings if isinstance(b.node, FUNCTIONS))
        elif isinstance(node, ast.Call):
            node = unplaced(node)  # ``losses.create(name, margin=m).cuda()``
            if not isinstance(node, ast.Call):
                continue
            found = project_def(m, node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            if found is None:
                cls = class_of_call(m, node)
                if cls is not None:
                    out.append(cls)
                continue
            pm, func, rel = found
            if isinstance(func, ast.ClassDef):
                out.append((pm, func, rel))
                continue
            # a closure it returns (``make_loss(cfg)``'s ``loss_func``), or any class of the dict it
            # picks from by name (``losses.create(name)``)
            out.extend(returned_callables(pm, func, rel))
    return out


class Handed(NamedTuple):
    """A value the script hands to a project module's code that calls it where it trains."""

    call: ast.Call  # the script's call into the project (``do_train(..., loss_fn)``, ``Trainer(model, model_fn)``)
    arg: ast.AST  # what it passes
    param: str  # the parameter (or the attribute the object keeps it in) that code calls
    rel: str  # the project module that calls it
    line: int  # where it is called there
    made: List[Tuple[SemanticModel, ast.AST, str]]  # what it is when called (:func:`_made_by`)


def _called_attrs(pm: SemanticModel, cls: ast.ClassDef) -> List[Tuple[str, int]]:
    """``(attr, line)``: attributes of ``self`` that methods of ``cls`` (or of the classes
    that share its ``self``) call where the call trains (``loss, tb, disp =
    self.model_fn(self.model, batch)`` before ``loss.backward()``)."""
    from dp2ddp.model.loss_calls import trains_here

    out: List[Tuple[str, int]] = []
    family = pm.family(cls)  # the methods of its base classes run on it too (open-reid's BaseTrainer.train)
    methods = {name for c in family for name in pm.methods(c)}
    for c in family:
        for method in pm.methods(c).values():
            for node in ast.walk(method):
                f = node.func if isinstance(node, ast.Call) else None
                if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
                        and f.attr not in methods and trains_here(pm, node)):
                    out.append((f.attr, node.lineno))
    return out


def handed_callables(m: SemanticModel) -> List[Handed]:
    """Every value this script hands to a project function (as a parameter it calls where it
    trains) or to a project class's constructor (kept on ``self`` and called by a method
    where it trains), with what it is when called."""
    from dp2ddp.model.project_defs import project_def
    from dp2ddp.model.stores import constructor_argument

    got = m.cache.get("handed_callables")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Handed] = []
    for call in m.nodes(ast.Call):
        if m.resolve_call(call) is not None or not isinstance(call.func, (ast.Name, ast.Attribute)):
            continue
        found = project_def(m, call.func)
        if found is None:
            continue
        pm, func, rel = found
        if isinstance(func, FUNCTIONS):
            passed = [(param, line, pm.argument_for(func, call, param)) for param, line in _called_params(pm, func)]
        elif isinstance(func, ast.ClassDef):
            passed = [(attr, line, constructor_argument(pm, func, call, attr)) for attr, line in _called_attrs(pm, func)]
        else:
            continue
        for param, line, arg in passed:
            if arg is not None:
                out.append(Handed(call, arg, param, rel, line, _made_by(m, arg)))
    m.cache["handed_callables"] = out
    return out


def handed_in_batch_losses(m: SemanticModel) -> List[HandedLoss]:
    """Every loss this script hands to a project module's training code that couples the
    samples of the batch (see the module docstring)."""
    got = m.cache.get("handed_losses")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[HandedLoss] = []
    seen: Set[int] = set()
    for h in handed_callables(m):
        if id(h.arg) in seen:
            continue
        for made in h.made:
            hit = coupling_when_called(*made)
            if hit is not None:
                seen.add(id(h.arg))
                out.append(HandedLoss(h.call, h.arg, h.param, h.rel, h.line, *hit))
                break
    m.cache["handed_losses"] = out
    return out


def handed_count_means(m: SemanticModel) -> List[Tuple[Handed, str]]:
    """``(handed, where)``: values this script hands to a project module's training code
    that average the loss over a count of the batch when called (``where``:
    :func:`dp2ddp.model.valid_means.count_mean_when_called`). Under DDP that code computes
    it on each rank's share, and the script's rewrite cannot reach inside it."""
    from dp2ddp.model.valid_means import count_mean_when_called

    out: List[Tuple[Handed, str]] = []
    seen: Set[int] = set()  # each value, and each function it is, once (``model_fn`` and ``model_fn_eval`` alike)
    for h in handed_callables(m):
        if id(h.arg) in seen:
            continue
        for pm, node, rel in h.made:
            if id(node) in seen:
                seen.add(id(h.arg))
                break
            where = count_mean_when_called(pm, node, rel)
            if where is not None:
                seen.update((id(h.arg), id(node)))
                out.append((h, where))
                break
    return out
