"""Counts a training step sums from its batch: the valid tokens of a padded batch
(``mask.sum()``), the matched anchors (``(iou > t).sum()``), the sum of the samples'
weights. A loss divided by one is a ratio of sums over the batch: under DataParallel over
the whole batch, under DDP over each rank's share (:mod:`dp2ddp.model.valid_means` finds
those losses; :mod:`dp2ddp.model.losses` counts a summed loss divided by one as a mean)."""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.call_args import argument
from dp2ddp.model.core import SemanticModel


_SAME_NUMBER = frozenset({"float", "double", "long", "int", "to", "cuda", "cpu", "item", "detach", "type_as"})


def data_count(m: SemanticModel, e: ast.AST, depth: int = 0) -> Optional[ast.AST]:
    """The node of a data-dependent count that ``e`` is, under ``max(1, c)``,
    ``c.clamp(min=1)``, ``torch.clamp(c, min=1)``, ``float(c)``, ``c.float()``, ``c + eps``: a ``.sum()`` call of data,
    or a name its function binds only to such counts (``num_pos = (labels > 0).sum()``); else
    None."""
    for _ in range(6):
        if isinstance(e, ast.Call) and m.is_name(e.func, {"builtins.max"}) and len(e.args) == 2:
            consts = [a for a in e.args if isinstance(a, ast.Constant)]
            if len(consts) != 1:
                return None
            e = e.args[0] if e.args[1] is consts[0] else e.args[1]
        elif isinstance(e, ast.Call) and m.is_name(e.func, {"builtins.float", "builtins.int"}) and len(e.args) == 1:
            e = e.args[0]
        elif (isinstance(e, ast.Call) and m.is_name(e.func, {"torch.clamp", "torch.clamp_min", "torch.clip"})
              and argument(e, _CLAMP, "input") is not None and _is_none(argument(e, _CLAMP, "max"))):
            e = argument(e, _CLAMP, "input")  # ``torch.clamp(mask.sum(), min=1.0)``
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and (
                e.func.attr in _SAME_NUMBER or e.func.attr in ("clamp", "clamp_min")) and m.resolve_call(e) is None:
            if e.func.attr == "clamp" and any(k.arg == "max" for k in e.keywords):
                return None
            e = e.func.value
        elif isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add) and isinstance(e.right, ast.Constant):
            e = e.left
        elif isinstance(e, ast.Call) and len(e.args) == 1 and _global_count(m, e):
            e = e.args[0]  # the migration's global_count(...): the count it was
        else:
            break
    if isinstance(e, ast.Name) and depth < 2:
        _, bindings = m.lookup(e.id, m.scope_of(e))
        if (bindings and all(b.kind == "assign" and b.value is not None for b in bindings)
                and all(m.enclosing_function(b.node) is m.enclosing_function(e) for b in bindings)
                and all(data_count(m, b.value, depth + 1) is not None for b in bindings)):
            return e
        return None
    if not isinstance(e, ast.Call):
        return None
    summed: Optional[ast.AST] = None
    if isinstance(e.func, ast.Attribute) and e.func.attr in ("sum", "count_nonzero") and not e.args and not e.keywords:
        if m.is_name(e.func.value, {"torch"}) or m.resolve_call(e) is not None:
            return None
        summed = e.func.value
    elif m.is_name(e.func, {"torch.sum", "torch.count_nonzero"}) and len(e.args) == 1 and not e.keywords:
        summed = e.args[0]
    if summed is None or not _from_data(m, summed, 0):
        return None
    return e


_CLAMP = ("input", "min", "max")


def _is_none(e: Optional[ast.AST]) -> bool:
    """No value: not passed, or ``None``."""
    return e is None or (isinstance(e, ast.Constant) and e.value is None)


def _from_data(m: SemanticModel, e: ast.AST, depth: int) -> bool:
    """``e`` is a mask, a comparison or weights of the batch: it holds a comparison, or its
    names lead to one (or to a field of a loop's batch) through plain assignments of its
    function, and no call of a model or of the script's own functions."""
    if depth > 3:
        return False
    if any(isinstance(n, ast.Compare) for n in ast.walk(e)):
        return not any(isinstance(n, ast.Call) and m.resolve_call(n) is not None for n in ast.walk(e))
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _SAME_NUMBER | {"bool", "view", "reshape", "flatten"}:
        return _from_data(m, e.func.value, depth)
    if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name) and _loop_target(m, e.value):
        return True  # batch["attention_mask"]
    if isinstance(e, ast.Name):
        if _loop_target(m, e):
            return True  # the batch's own labels (`for x, y in loader`)
        _, bindings = m.lookup(e.id, m.scope_of(e))
        if not bindings:
            return False
        if all(b.kind == "assign" and b.value is not None for b in bindings):
            return all(_from_data(m, b.value, depth + 1) for b in bindings)
        return False
    return False


def _loop_target(m: SemanticModel, name: ast.Name) -> bool:
    """``name`` is bound by the target of a ``for`` (the batch a loop iterates)."""
    _, bindings = m.lookup(name.id, m.scope_of(name))
    return bool(bindings) and all(isinstance(m.statement_of(b.node), ast.For) for b in bindings)


def _global_count(m: SemanticModel, call: ast.Call) -> bool:
    """A call of a function of this module that all-reduces its one argument and divides
    by the world size (the migration's ``global_count``)."""
    from dp2ddp.model.names import GET_WORLD_SIZE

    func = m.resolve_call(call)
    if func is None:
        return False
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
    return (any(m.call_is(n, GET_WORLD_SIZE) for n in calls)
            and any(m.is_name(n.func, {"torch.distributed.all_reduce"}) for n in calls))
