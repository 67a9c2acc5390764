"""Training decisions made from what one rank's batches added up.

A script often adds up the training step's losses over an epoch (``total += loss.item()``,
or a list it appends them to and averages, ``np.mean(epoch_loss)``) and steps a
``ReduceLROnPlateau`` scheduler on the result. Under DataParallel that sum runs
over every batch of the epoch; under DDP each rank adds up its own share of every batch, so
each rank's value differs from the others' and from the original's: the ranks would change
their learning rate apart (their parameters then drift apart too) at epochs the original
would not. Whether the sum should be averaged or added over the ranks depends on what its
terms are (a batch's mean, a sum over samples), which dp2ddp does not decide.

* :func:`steered_by_shard`: the scheduler steps whose argument reads such a sum (in the
  loop's function, or through what a function of this module returns), and the tests that
  end the training (a ``break`` or ``return`` out of the loop of epochs: early stopping)
  on such a sum or on a name set under a test that reads one (``bad_epochs += 1`` when the
  loss did not improve): ranks that stop at different epochs leave the others waiting in
  their next all-reduce.
"""

from __future__ import annotations

import ast
from typing import Dict, List, NamedTuple, Optional, Set

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.flow import origins
from dp2ddp.model.steps import backward_calls, innermost_loop, own_nodes, receiver_kind
from dp2ddp.model.syntax import first_dim_of
from dp2ddp.model.training import training_loops


class Steered(NamedTuple):
    sink: ast.AST  # ``scheduler.step(metric)``, or the ``if`` that stops training
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
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend")
                  and isinstance(n.func.value, ast.Name)):
                # ``epoch_loss.append(float(loss))``, then ``scheduler.step(np.mean(epoch_loss))`` (retinanet)
                target, value = n.func.value, next(iter(n.args), None)
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
    out.extend(_early_stops(m, sums))
    return out


def _early_stops(m: SemanticModel, sums: Dict[int, Dict[str, ast.AST]]) -> List[Steered]:
    """``if`` tests that leave the loop of epochs (``break``/``return`` in their block) and
    read a shard sum (here, or through what a function returns), or a name assigned under a
    test that reads one (to a fixed point)."""
    stepping = {id(innermost_loop(m, c)) for c in backward_calls(m)}
    # loops of epochs: they train (through a nested loop or a function they call), no backward is their own
    epochs = [lp for lp in training_loops(m) if id(lp) not in stepping]
    if not epochs:
        return []
    out: List[Steered] = []
    scopes = {id(m.enclosing_function(lp) or m.tree): m.enclosing_function(lp) or m.tree for lp in epochs}
    for scope in scopes.values():
        ifs = [n for n in m.nodes(ast.If) if (m.enclosing_function(n) or m.tree) is scope]
        tainted: Dict[str, tuple] = {}

        def reads(test: ast.AST) -> Optional[tuple]:
            for n in ast.walk(test):
                if not isinstance(n, ast.Name):
                    continue
                if n.id in tainted:
                    return tainted[n.id]
                found = _reads_sum(m, [n, *(o for o, path in origins(m, n) if not path)], sums)
                if found is not None:
                    tainted[n.id] = found
                    return found
            return None

        changed = True
        while changed:
            changed = False
            for node in ifs:
                origin = reads(node.test)
                if origin is None:
                    continue
                for stmt in ast.walk(node):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AugAssign) else []
                    for t in targets:
                        if isinstance(t, ast.Name) and t.id not in tainted:
                            tainted[t.id] = origin
                            changed = True
        for node in ifs:
            origin = reads(node.test)
            if origin is not None and any(_leaves(m, node, lp) for lp in epochs):
                out.append(Steered(node, origin[1], origin[0]))
    return out


def _leaves(m: SemanticModel, node: ast.If, loop: ast.AST) -> bool:
    """``node`` is inside the loop of epochs ``loop`` and its blocks ``break`` out of it or
    ``return``."""
    if not m.contains(loop, node):
        return False
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.Return):
            return True
        if isinstance(stmt, ast.Break) and (m.enclosing_loops(stmt) or [None])[0] is loop:
            return True
    return False


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
