"""Training decisions made from what one rank's batches added up.

A script often adds up the training step's losses over an epoch (``total += loss.item()``)
and steps a ``ReduceLROnPlateau`` scheduler on the result. Under DataParallel that sum runs
over every batch of the epoch; under DDP each rank adds up its own share of every batch, so
each rank's value differs from the others' and from the original's: the ranks would change
their learning rate apart (their parameters then drift apart too) at epochs the original
would not. Whether the sum should be averaged or added over the ranks depends on what its
terms are (a batch's mean, a sum over samples), which dp2ddp does not decide.

* :func:`steered_by_shard`: the scheduler steps whose argument reads such a sum (in the
  loop's function, or through what a function of this module returns).
"""

from __future__ import annotations

import ast
from typing import Dict, List, NamedTuple, Optional, Set

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.steps import own_nodes, receiver_kind
from dp2ddp.model.syntax import first_dim_of
from dp2ddp.model.training import training_loops


class Steered(NamedTuple):
    sink: ast.Call  # ``scheduler.step(metric)``
    added: ast.AST  # where the sum is added to (``total += loss.item()``)
    name: str  # the sum's name


def steered_by_shard(m: SemanticModel) -> List[Steered]:
    got = m.cache.get("shard_steering")
    if got is None:
        got = m.cache["shard_steering"] = _find(m)
    return got  # type: ignore[return-value]


def _sums(m: SemanticModel) -> Dict[int, Dict[str, ast.AST]]:
    """id(scope) -> name -> where a loop over the training batches adds a varying value to it."""
    loops = training_loops(m)
    inner = [lp for lp in loops if not any(o is not lp and m.contains(lp, o) for o in loops)]
    out: Dict[int, Dict[str, ast.AST]] = {}
    for lp in inner:
        scope = m.enclosing_function(lp) or m.tree
        for n in own_nodes(m, lp):
            target = value = None
            if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add):
                target, value = n.target, n.value
            elif (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.BinOp)
                  and isinstance(n.value.op, ast.Add) and isinstance(n.targets[0], ast.Name)
                  and isinstance(n.value.left, ast.Name) and n.value.left.id == n.targets[0].id):
                target, value = n.targets[0], n.value.right
            if not isinstance(target, ast.Name) or value is None or _same_on_every_rank(value):
                continue
            out.setdefault(id(scope), {}).setdefault(target.id, n)
    return out


def _same_on_every_rank(value: ast.AST) -> bool:
    """A constant (``count += 1``) or a batch's size (``seen += x.size(0)``: equal shares)."""
    return isinstance(value, ast.Constant) or first_dim_of(value) is not None


def _find(m: SemanticModel) -> List[Steered]:
    sums = _sums(m)
    if not sums:
        return []
    from dp2ddp.model.flow import origins

    out: List[Steered] = []
    for call in m.calls_spelled("step"):
        f = call.func
        if not (isinstance(f, ast.Attribute) and (call.args or call.keywords)) or receiver_kind(m, f.value) != "scheduler":
            continue
        exprs: List[ast.AST] = [*call.args, *(k.value for k in call.keywords)]
        for a in list(exprs):
            exprs.extend(n for n, path in origins(m, a) if not path)
        found = _reads_sum(m, exprs, sums)
        if found is not None:
            out.append(Steered(call, found[1], found[0]))
    return out


def _reads_sum(m: SemanticModel, exprs: List[ast.AST], sums: Dict[int, Dict[str, ast.AST]]) -> Optional[tuple]:
    seen: Set[int] = set()
    for e in exprs:
        if id(e) in seen:
            continue
        seen.add(id(e))
        scope = m.enclosing_function(e) or m.tree
        here = sums.get(id(scope), {})
        for n in ast.walk(e):
            if isinstance(n, ast.Name) and n.id in here:
                return n.id, here[n.id]
    return None
