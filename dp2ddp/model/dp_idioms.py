"""Code written for DataParallel around its wraps, which DDP makes dead or wrong.

* :func:`dp_loss_means`: ``if n_gpu > 1: loss = loss.mean()``, DataParallel's averaging of
  the per-GPU losses it gathers (under DDP the loss is already a scalar); :func:`is_elif`
  tells an ``elif`` from an ``if`` alone in an ``else``.
* :func:`dp_helper_calls`: the wrapper passed to a function of the project's own modules
  that is written for DataParallel, and what the function does with it (:func:`helper_kind`:
  asserts ``isinstance(model, DataParallel)`` as ``patch_replication_callback(model)`` does;
  unwraps only a DataParallel before anything else, as a ``save_model(model, ...)`` that
  saves the bare model's keys; checks for both wrappers; anything else);
  :func:`asserting_helper_statements`: the statements that only call one that asserts.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DDP, DP
from dp2ddp.model.project_defs import project_calls
from dp2ddp.model.syntax import FUNCTIONS


GPU_COUNT = re.compile(r"n_?gpus?$|num_?gpus?$|gpu_?count$|device_count$|world_size$", re.IGNORECASE)


def identifiers_in(expr: ast.AST):
    """Every name, attribute, keyword and parameter name spelled in ``expr``."""
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
            and any(GPU_COUNT.search(i) for i in identifiers_in(node.test))  # type: ignore[attr-defined]
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


# what a project function written for DataParallel does with the wrapper it is handed
ASSERTS = "asserts"  # ``assert isinstance(model, DataParallel)``: under DDP it can only fail
UNWRAPS = "unwraps"  # ``if isinstance(model, DataParallel): model = model.module`` before any other use,
# or both branches do the same on the wrapped and the bare model (``return model.module.state_dict()``)
BOTH = "both"  # every type check names DistributedDataParallel too: it works on either wrapper
OTHER = "other"  # anything else: under DDP it takes the branch written for the bare model


@dataclass
class DpHelperCall:
    call: ast.Call  # in this script, with the wrapper as an argument
    name: str
    where: str  # ``modeling/sync_batchnorm/replicate.py:50``: its first DataParallel reference
    kind: str = OTHER  # ASSERTS, UNWRAPS, BOTH or OTHER (:func:`helper_kind`)
    arg: Optional[ast.AST] = None  # the argument that hands it the wrapper
    path: str = ""  # the helper's module file

    @property
    def asserts(self) -> bool:
        """It asserts ``isinstance(<arg>, DataParallel)``: under DDP it can only fail."""
        return self.kind == ASSERTS


def _type_check_classes(pm: SemanticModel, ref: ast.AST) -> Optional[List[ast.AST]]:
    """``ref`` (a DataParallel name) is the class, or one of the tuple of classes, of an
    ``isinstance(x, ...)``: every class that check names; else None."""
    parent = pm.parent(ref)
    classes: List[ast.AST] = [ref]
    if isinstance(parent, ast.Tuple):
        classes, ref, parent = list(parent.elts), parent, pm.parent(parent)
    if (isinstance(parent, ast.Call) and pm.is_name(parent.func, {"builtins.isinstance"}) and len(parent.args) == 2
            and parent.args[1] is ref):
        return classes
    return None


def _unwrap_of(pm: SemanticModel, stmt: ast.stmt, param: str) -> bool:
    """``if isinstance(param, DP): param = param.module`` (no ``else``), or ``param =
    param.module if isinstance(param, DP) else param``."""
    def is_unwrap(value: ast.AST) -> bool:
        return isinstance(value, ast.Attribute) and value.attr == "module" and isinstance(value.value, ast.Name) \
            and value.value.id == param

    def stores_param(s: ast.stmt) -> bool:
        return isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
            and s.targets[0].id == param

    if isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1 and _is_check(pm, stmt.test, param):
        return stores_param(stmt.body[0]) and is_unwrap(stmt.body[0].value)  # type: ignore[attr-defined]
    if stores_param(stmt) and isinstance(stmt.value, ast.IfExp):  # type: ignore[attr-defined]
        e = stmt.value  # type: ignore[attr-defined]
        return _is_check(pm, e.test, param) and is_unwrap(e.body) and isinstance(e.orelse, ast.Name) and e.orelse.id == param
    return False


def helper_kind(pm: SemanticModel, func: ast.AST, param: Optional[str]) -> str:
    """What ``func`` (a function of a project module whose body names DataParallel) does
    with the wrapper handed to its parameter ``param`` (None: not known)."""
    refs = [r for r in pm.refs(DP) if pm.contains(func, r)]
    if any(isinstance(n, ast.Assert) and isinstance(n.test, ast.Call) and pm.is_name(n.test.func, {"builtins.isinstance"})
           and len(n.test.args) == 2 and pm.is_name(n.test.args[1], DP) for n in ast.walk(func)):
        return ASSERTS
    checks = [_type_check_classes(pm, r) for r in refs]
    if refs and all(c is not None and any(pm.is_name(x, DDP) for x in c) for c in checks):
        return BOTH
    if param is None:
        return OTHER
    body = list(func.body)  # type: ignore[attr-defined]
    for i, stmt in enumerate(body):
        if _unwrap_of(pm, stmt, param) or _same_either_way(pm, stmt, body[i + 1:], param):
            uses_before = any(isinstance(n, ast.Name) and n.id == param for s in body[:i] for n in ast.walk(s))
            only_there = all(pm.contains(stmt, r) for r in refs)
            return UNWRAPS if not uses_before and only_there else OTHER
    return OTHER


def _is_check(pm: SemanticModel, test: ast.AST, param: str) -> bool:
    """``isinstance(param, <classes>)``."""
    return (isinstance(test, ast.Call) and pm.is_name(test.func, {"builtins.isinstance"}) and len(test.args) == 2
            and isinstance(test.args[0], ast.Name) and test.args[0].id == param)


class _ModuleToBare(ast.NodeTransformer):
    def __init__(self, param: str) -> None:
        self.param = param

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr == "module" and isinstance(node.value, ast.Name) and node.value.id == self.param:
            return ast.Name(id=self.param, ctx=node.ctx)
        self.generic_visit(node)
        return node


def _without_module(node: ast.AST, param: str) -> str:
    """``ast.dump`` of ``node`` with ``param.module`` read as ``param``."""
    import copy

    return ast.dump(_ModuleToBare(param).visit(copy.deepcopy(node)))


def _same_either_way(pm: SemanticModel, stmt: ast.stmt, rest: List[ast.stmt], param: str) -> bool:
    """``if isinstance(param, DP): <A on param.module> [else: <A on param>]`` (without
    ``else``: the statements after the ``if``, which the DataParallel branch must leave by
    ``return``): both branches do the same, one on the wrapped model and one on the bare
    one (``return model.module.state_dict()`` / ``return model.state_dict()``), so the bare
    model handed in takes the other branch and does what the wrapper did. Also as one
    expression: ``return param.module.x() if isinstance(param, DP) else param.x()``."""
    if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.IfExp) and _is_check(pm, stmt.value.test, param):
        return _without_module(stmt.value.body, param) == ast.dump(stmt.value.orelse)
    if not isinstance(stmt, ast.If) or not _is_check(pm, stmt.test, param):
        return False
    other = stmt.orelse
    if not other:
        if not stmt.body or not isinstance(stmt.body[-1], ast.Return):
            return False
        other = rest
    wrapped = [_without_module(s, param) for s in stmt.body]
    return bool(other) and wrapped == [ast.dump(s) for s in other]


def dp_helper_calls(m: SemanticModel) -> List[DpHelperCall]:
    """Calls that pass the DataParallel wrapper to a function of a project module (a file
    beside the script) whose body names DataParallel: written for DataParallel, it will
    meet a DDP wrapper after the migration."""
    from dp2ddp.model.collectives import var_key, wrapped_vars

    got = m.cache.get("dp_helper_calls")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.wraps import dp_wraps

    out: List[DpHelperCall] = []
    keys = wrapped_vars(m, dp=True)
    wraps = [(var_key(m, w.target), w.call) for w in dp_wraps(m) if w.target is not None]

    def wrapped_by_then(a: ast.AST) -> bool:
        """``a`` may hold the wrapper where the call runs: not a call that runs before
        every wrap of its variable (``model = convert_model(model)`` above ``model = DP(model)``)."""
        key = var_key(m, a)
        if key not in keys:
            return False
        mine = [call for k, call in wraps if k == key]
        return not mine or not all(m.runs_before(a, call) for call in mine)

    for call, (pm, func, rel) in project_calls(m):
        if not isinstance(func, FUNCTIONS):
            continue
        args = list(call.args) + [k.value for k in call.keywords]
        if not any(wrapped_by_then(a) for a in args if not isinstance(a, ast.Starred)):
            continue
        refs = [r for r in pm.refs(DP) if pm.contains(func, r)]
        if not refs:
            continue
        arg, param = handed(m, pm, func, call, keys)
        kind = helper_kind(pm, func, param)
        out.append(DpHelperCall(call, func.name, f"{rel}:{refs[0].lineno}", kind, arg, pm.path or ""))  # type: ignore[attr-defined]
    m.cache["dp_helper_calls"] = out
    return out


def handed(m: SemanticModel, pm: SemanticModel, func: ast.AST, call: ast.Call, keys) -> tuple:
    """``(argument, parameter)``: the one argument of ``call`` that hands ``func`` a wrapper
    (one of ``keys``) and the parameter it binds to; ``(None, None)`` where that is not one."""
    from dp2ddp.model.collectives import var_key

    a = func.args  # type: ignore[attr-defined]
    params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    found = [(pm.argument_for(func, call, p), p) for p in params]
    found = [(arg, p) for arg, p in found if arg is not None and var_key(m, arg) in keys]
    passed = [x for x in list(call.args) + [k.value for k in call.keywords] if not isinstance(x, ast.Starred)
              and var_key(m, x) in keys]
    if len(found) != 1 or len(passed) != 1:
        return None, None
    return found[0]


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
