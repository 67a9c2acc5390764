"""Losses that sum over the samples a process sees, where they are made.

:func:`made_sums`: a ``torch.nn`` loss (class or functional) given ``reduction="sum"`` or
``size_average=False``, another callee given ``reduction="sum"``, and a loss class (this
module's or a project module's) whose ``forward`` returns a total of an elementwise
expression of its inputs (the Charbonnier loss of super-resolution code);
:func:`not_a_total`: a return of such a class that is no total. :mod:`dp2ddp.model.losses`
follows each to the backward passes it reaches.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loss_calls import bound_to
from dp2ddp.model.loss_terms import rank_constant
from dp2ddp.model.syntax import kwarg, summing_keyword


def made_sums(m: SemanticModel) -> List[Tuple[ast.Call, ast.AST, bool]]:
    """(where a summing loss is made, what makes it sum, functional): ``torch.nn`` losses
    with ``reduction="sum"``/``size_average=False``, any other callee outside torch given
    ``reduction="sum"`` (a loss function held on ``self``, a project's loss), and instances of this module's loss
    classes whose ``forward`` returns the total of an elementwise expression of its inputs
    (``torch.sum(torch.sqrt(diff * diff + self.eps))``, the Charbonnier loss of
    super-resolution code)."""
    got = m.cache.get("losses:made")
    if got is not None:
        return got  # type: ignore[return-value]
    totals = _total_classes(m)
    out: List[Tuple[ast.Call, ast.AST, bool]] = []
    for made in m.nodes(ast.Call):
        arg = summing_keyword(made)
        names = m.qualified_names(made.func)
        if arg is not None and any(q.startswith("torch.nn.") for q in names):
            out.append((made, arg, any(q.startswith("torch.nn.functional.") for q in names)))
        elif arg is not None and kwarg(made, "reduction") is arg and not any(q.startswith("torch.") for q in names):
            # a callee dp2ddp cannot name (``loss_func = self.loss_func``, a project's loss)
            # given torch's ``reduction="sum"``: a sum; called on data, it computes the loss
            out.append((made, arg, bool(made.args)))
        elif isinstance(made.func, ast.Name) and made.func.id in totals:
            cls = totals[made.func.id]
            _, bindings = m.lookup(made.func.id, m.scope_of(made))
            if [b.node for b in bindings] == [cls]:
                out.append((made, cls, False))
        elif isinstance(made.func, (ast.Name, ast.Attribute)) and bound_to(m, made) is not None:
            cls = _project_total_class(m, made)
            if cls is not None:
                out.append((made, cls, False))
    m.cache["losses:made"] = out
    return out


def _project_total_class(m: SemanticModel, made: ast.Call) -> Optional[ast.ClassDef]:
    """``criterion = SumLoss()`` where ``SumLoss`` is a loss class of one of the project's
    own modules (``from losses import SumLoss``) whose ``forward`` returns a total."""
    from dp2ddp.model.project_defs import project_def

    names = m.qualified_names(made.func)
    if not names or any(q.split(".", 1)[0] in ("torch", "builtins") for q in names):
        return None
    got = project_def(m, made.func)
    if got is None or not isinstance(got[1], ast.ClassDef) or got[0] is m:
        return None
    cls = _total_classes(got[0]).get(got[1].name)
    if cls is not got[1]:
        return None
    m.cache.setdefault("losses:class-files", {})[id(cls)] = (got[0], got[2])  # type: ignore[index]
    return cls


_ELEMENTWISE = frozenset({"sqrt", "abs", "exp", "log", "pow", "square", "log1p", "sigmoid", "add", "sub", "mul", "div"})


def _total_classes(m: SemanticModel) -> Dict[str, ast.ClassDef]:
    """This module's loss classes whose ``forward`` returns a total over the samples: every
    return (:func:`_total_of`), or some of them (:func:`not_a_total` says which return is
    not: such a class's use is refused, not scaled)."""
    from dp2ddp.model.kinds import is_module_class

    got = m.cache.get("losses:totals")
    if got is not None:
        return got  # type: ignore[return-value]
    out = {}
    partial: Dict[int, ast.AST] = m.cache.setdefault("losses:partial", {})  # type: ignore[assignment]
    for cls in m.nodes(ast.ClassDef):
        if not is_module_class(m, cls) or m.enclosing_function(cls) is not None:
            continue
        forward = m.methods(cls).get("forward")
        if forward is None:
            continue
        params = {a.arg for a in forward.args.args[1:]}
        returns = [n.value for n in ast.walk(forward) if isinstance(n, ast.Return) and n.value is not None]
        totals = [r for r in returns if params and _total_of(m, r, params)]
        if totals:
            out[cls.name] = cls
            other = next((r for r in returns if r not in totals), None)
            if other is not None:
                partial[id(cls)] = other
    m.cache["losses:totals"] = out
    return out


def not_a_total(m: SemanticModel, cls: ast.ClassDef) -> Optional[ast.AST]:
    """A return of a total class's ``forward`` that is no total (a mean on another path),
    the class being this module's or a project module's a call of this module makes."""
    _total_classes(m)
    partial: Dict[int, ast.AST] = m.cache["losses:partial"]  # type: ignore[assignment]
    if id(cls) in partial:
        return partial[id(cls)]
    where = m.cache.get("losses:class-files", {}).get(id(cls))
    return not_a_total(where[0], cls) if where is not None else None


def _total_of(m: SemanticModel, e: ast.AST, params: Set[str], depth: int = 0) -> bool:
    """``torch.sum(x)`` or ``x.sum()`` (every element) of an elementwise expression of
    ``params`` (and constants, ``self.`` attributes); a summing ``torch.nn`` loss of them
    (``F.cross_entropy(logits, target, reduction="sum")``, or ``self.crit(...)`` made in
    ``__init__`` as ``nn.MSELoss(reduction="sum")``); such totals added up, or times a
    factor the same on every rank (``self.weight * ...``)."""
    e = _local_value(m, e)
    if depth > 8:
        return False
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        return _total_of(m, e.left, params, depth + 1) and _total_of(m, e.right, params, depth + 1)
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and rank_constant(m, e.left):
        return _total_of(m, e.right, params, depth + 1)
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Mult, ast.Div)) and rank_constant(m, e.right):
        return _total_of(m, e.left, params, depth + 1)
    if isinstance(e, ast.Call) and _summing_loss_call(m, e):
        met: Set[str] = set()
        return all(_elementwise_of(m, a, params, met) for a in e.args) and bool(met)
    if isinstance(e, ast.Call) and not e.keywords:
        if m.is_name(e.func, {"torch.sum"}) and len(e.args) == 1:
            inner = e.args[0]
        elif isinstance(e.func, ast.Attribute) and e.func.attr == "sum" and not e.args:
            inner = e.func.value
        else:
            return False
        return _elementwise(m, inner, params)
    return False


def _summing_loss_call(m: SemanticModel, call: ast.Call) -> bool:
    """A ``torch.nn`` loss that sums: the functional given ``reduction="sum"``, or
    ``self.<attr>(...)`` where the class (its family) assigns ``self.<attr>`` once, a summing
    ``torch.nn`` loss class."""
    if summing_keyword(call) is not None:
        return any(q.startswith("torch.nn.functional.") for q in m.qualified_names(call.func))
    from dp2ddp.model.stores import attribute_assignments

    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"):
        return False
    cls = m.enclosing_class(m.enclosing_function(call))
    made = attribute_assignments(m, cls).get(f.attr, []) if cls is not None else []
    return len(made) == 1 and isinstance(made[0], ast.Call) and summing_keyword(made[0]) is not None and any(
        q.startswith("torch.nn.") and not q.startswith("torch.nn.functional.") for q in m.qualified_names(made[0].func))


def _local_value(m: SemanticModel, e: ast.AST) -> ast.AST:
    """What a local name of a ``forward`` holds, where it is assigned once (``diff = x - y``)."""
    for _ in range(8):
        if not isinstance(e, ast.Name):
            return e
        _, bindings = m.lookup(e.id, m.scope_of(e))
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].value is None:
            return e
        e = bindings[0].value
    return e


def _elementwise(m: SemanticModel, e: ast.AST, params: Set[str]) -> bool:
    """An expression of ``params`` (at least one of them) element by element."""
    met: Set[str] = set()
    return _elementwise_of(m, e, params, met) and bool(met)


def _elementwise_of(m: SemanticModel, e: ast.AST, params: Set[str], met: Set[str], depth: int = 0) -> bool:
    """``e`` is elementwise over ``params``, constants and ``self.`` attributes (local names
    followed to what they hold); the parameters it reads go to ``met``."""
    if depth > 16:
        return False
    e = _local_value(m, e) if not (isinstance(e, ast.Name) and e.id in params) else e
    d = depth + 1
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        return _elementwise_of(m, e.left, params, met, d) and _elementwise_of(m, e.right, params, met, d)
    if isinstance(e, ast.UnaryOp):
        return _elementwise_of(m, e.operand, params, met, d)
    if isinstance(e, ast.Constant):
        return isinstance(e.value, (int, float))
    if isinstance(e, ast.Name):
        if e.id in params:
            met.add(e.id)
            return True
        return False
    if isinstance(e, ast.Attribute):
        return isinstance(e.value, ast.Name) and e.value.id == "self"
    if isinstance(e, ast.Call) and not e.keywords:
        f = e.func
        if (isinstance(f, ast.Attribute) and f.attr in _ELEMENTWISE
                and not (isinstance(f.value, ast.Name) and m.is_imported(f.value))):  # a tensor's method, ``mu.pow(2)``
            return _elementwise_of(m, f.value, params, met, d) and all(_elementwise_of(m, a, params, met, d) for a in e.args)
        if any(q.startswith("torch.") and q.rsplit(".", 1)[-1] in _ELEMENTWISE for q in m.qualified_names(f)):
            return all(_elementwise_of(m, a, params, met, d) for a in e.args)
    return False
