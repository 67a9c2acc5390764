"""Code written for DataParallel around its wraps, which DDP makes dead or wrong.

* :func:`dp_loss_means`: ``if n_gpu > 1: loss = loss.mean()``, DataParallel's averaging of
  the per-GPU losses it gathers (under DDP the loss is already a scalar); :func:`is_elif`
  tells an ``elif`` from an ``if`` alone in an ``else``.
* :func:`dp_helper_calls`: the wrapper passed to a function of the project's own modules
  that is written for DataParallel (``patch_replication_callback(model)`` asserting
  ``isinstance(model, DataParallel)``); :func:`asserting_helper_statements`: the statements
  that only call one that asserts.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Dict, List

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DP
from dp2ddp.model.project_defs import project_calls
from dp2ddp.model.syntax import FUNCTIONS


GPU_COUNT = re.compile(r"n_?gpus?$|num_?gpus?$|gpu_?count$|device_count$|world_size$", re.IGNORECASE)


def _identifiers_in(expr: ast.AST):
    for n in ast.walk(expr):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr
        elif isinstance(n, ast.keyword) and n.arg:
            yield n.arg
        elif isinstance(n, ast.arg):
            yield n.arg


def _same_target(a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` are the same expression, whatever their context (load/store)."""
    return ast.dump(a).replace("ctx=Store()", "ctx=Load()") == ast.dump(b)


def _self_mean(stmt: ast.stmt) -> bool:
    """``x = x.mean()``: a value averaged over itself."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return False
    v = stmt.value
    return (
        isinstance(v, ast.Call)
        and isinstance(v.func, ast.Attribute)
        and v.func.attr == "mean"
        and not v.args
        and not v.keywords
        and _same_target(stmt.targets[0], v.func.value)
    )


def dp_loss_means(m: SemanticModel) -> List[ast.If]:
    """DataParallel's loss averaging: an ``if`` on the GPU count (``n_gpu``,
    ``args.n_gpu``, ``torch.cuda.device_count()``, ``world_size``) whose body only
    averages values over themselves (``if n_gpu > 1: loss = loss.mean()``). DataParallel
    gathers one loss per GPU; under DDP the loss is already a scalar and the ``if`` is
    dead code (with no ``else`` and not an ``elif``, it can simply go)."""
    got = m.cache.get("wraps:loss-means")
    if got is None:
        got = [
            node
            for node in m.nodes(ast.If)
            if node.body  # type: ignore[attr-defined]
            and all(_self_mean(s) for s in node.body)  # type: ignore[attr-defined]
            and any(GPU_COUNT.search(i) for i in _identifiers_in(node.test))  # type: ignore[attr-defined]
        ]
        m.cache["wraps:loss-means"] = got
    return got  # type: ignore[return-value]


def is_elif(m: SemanticModel, node: ast.If) -> bool:
    """``node`` is the ``elif`` of an ``if`` (not an ``if`` alone in an ``else`` block)."""
    parent = m.parent(node)
    return (
        isinstance(parent, ast.If)
        and len(parent.orelse) == 1
        and parent.orelse[0] is node
        and m.line_text(node.lineno)[m.position(node)[1]:].startswith("elif")
    )


@dataclass
class DpHelperCall:
    call: ast.Call  # in this script, with the wrapper as an argument
    name: str
    where: str  # ``modeling/sync_batchnorm/replicate.py:50``: its first DataParallel reference
    asserts: bool  # it asserts ``isinstance(<arg>, DataParallel)``: under DDP it can only fail


def dp_helper_calls(m: SemanticModel) -> List[DpHelperCall]:
    """Calls that pass the DataParallel wrapper to a function of a project module (a file
    beside the script) whose body names DataParallel: written for DataParallel, it will
    meet a DDP wrapper after the migration."""
    from dp2ddp.model.collectives import var_key, wrapped_vars

    got = m.cache.get("dp_helper_calls")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[DpHelperCall] = []
    keys = wrapped_vars(m, dp=True)
    for call, (pm, func, rel) in project_calls(m):
        if not isinstance(func, FUNCTIONS):
            continue
        args = list(call.args) + [k.value for k in call.keywords]
        if not any(var_key(m, a) in keys for a in args if not isinstance(a, ast.Starred)):
            continue
        refs = [r for r in pm.refs(DP) if pm.contains(func, r)]
        if not refs:
            continue
        asserts = any(
            isinstance(n, ast.Assert) and isinstance(n.test, ast.Call) and pm.is_name(n.test.func, {"builtins.isinstance"})
            and len(n.test.args) == 2 and pm.is_name(n.test.args[1], DP)
            for n in ast.walk(func)
        )
        out.append(DpHelperCall(call, func.name, f"{rel}:{refs[0].lineno}", asserts))  # type: ignore[attr-defined]
    m.cache["dp_helper_calls"] = out
    return out


def asserting_helper_statements(m: SemanticModel) -> Dict[int, "DpHelperCall"]:
    """``id(statement) -> call`` for statements that only call a project helper asserting a
    DataParallel (``patch_replication_callback(model)``): dp_idioms removes them (DDP126),
    so a hoisted wrap may move past them."""
    out = {}
    for h in dp_helper_calls(m):
        stmt = m.parent(h.call)
        if h.asserts and isinstance(stmt, ast.Expr) and stmt.value is h.call:
            out[id(stmt)] = h
    return out
