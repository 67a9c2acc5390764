"""What a checkpoint holds, and what reads it back.

* :func:`saved_parts`: the pieces of what ``torch.save(obj, ...)`` writes — ``obj`` itself,
  and the items of the dict, list or tuple it is (a literal at the call, or a name whose
  values are such literals and what is put into them: ``state = {"net": net}``,
  ``state["opt"] = opt.state_dict()``), followed with :mod:`dp2ddp.model.flow`.
* :func:`whole_wrapper_saves`: the parts that are a wrapped model itself (not its
  ``state_dict()``): pickling a ``DistributedDataParallel`` object ties the file to the
  wrapper class and a process group; it no longer loads in an evaluation script.
* :func:`wrapper_restored`: a wrapper variable assigned from what ``torch.load`` returns
  (``net = checkpoint["net"]``): the resumed object replaces the wrapper.

The keys a checkpoint's ``state_dict`` is written with (``module.`` or not) are
:mod:`dp2ddp.model.checkpoint_keys`'s.
"""

from __future__ import annotations

import ast
from typing import List, Set, Tuple

from dp2ddp.model.call_args import SAVE_PARAMS, argument
from dp2ddp.model.collectives import VarKey, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import LOAD, SAVE


def saved_object(call: ast.Call) -> ast.AST:
    """``torch.save(obj, f)``: ``obj`` (the call itself where it cannot be read)."""
    obj = argument(call, SAVE_PARAMS, "obj")
    return obj if obj is not None else call


def saved_parts(m: SemanticModel, call: ast.Call) -> List[ast.AST]:
    """Expressions whose values ``torch.save`` writes (see the module docstring)."""
    from dp2ddp.model.flow import ValueFlow

    flow = ValueFlow.of(m)
    obj = saved_object(call)
    out: List[ast.AST] = []
    seen: Set[int] = set()

    def add(e: ast.AST, depth: int) -> None:
        if id(e) in seen or depth > 3:
            return
        seen.add(id(e))
        if isinstance(e, ast.Dict):
            for k, v in zip(e.keys, e.values):
                add(v, depth + 1)
            return
        if isinstance(e, (ast.List, ast.Tuple)):
            for v in e.elts:
                add(v.value if isinstance(v, ast.Starred) else v, depth + 1)
            return
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "dict":
            for kw in e.keywords:
                add(kw.value, depth + 1)
            return
        if isinstance(e, ast.IfExp):  # ``net.module if use_cuda else net``: either may be saved
            add(e.body, depth + 1)
            add(e.orelse, depth + 1)
            return
        out.append(e)
        if isinstance(e, ast.Name):
            for node, path in flow.value(e, 0):
                if not path and node is not e and isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Call)):
                    if isinstance(node, (ast.Dict, ast.List, ast.Tuple)) or (isinstance(node.func, ast.Name) and node.func.id == "dict"):
                        add(node, depth + 1)
            for v in flow._mutations(e):
                add(v, depth + 1)

    add(obj, 0)
    return out


def saves(m: SemanticModel) -> List[ast.Call]:
    return list(m.calls(SAVE))


def whole_wrapper_saves(m: SemanticModel, wrappers: Set[VarKey]) -> List[Tuple[ast.Call, ast.AST]]:
    """``(torch.save call, the part that is a wrapper variable itself)``."""
    out = []
    for call in saves(m):
        for part in saved_parts(m, call):
            if isinstance(part, (ast.Name, ast.Attribute)) and var_key(m, part) in wrappers:
                out.append((call, part))
    return out


def helper_whole_saves(m: SemanticModel, wrappers: Set[VarKey]) -> List[Tuple[ast.Call, ast.AST, str]]:
    """``(call of a project function, the wrapper it is handed, where it saves it)``: a helper
    such as ``utils.save_checkpoint(model, path, is_best)`` whose parameter is saved whole
    (``torch.save(state, filename)``) and used for nothing else (pt.darts' augment.py)."""
    from dp2ddp.model.project_defs import project_calls
    from dp2ddp.model.syntax import FUNCTIONS

    out = []
    for call, (pm, func, rel) in project_calls(m):
        if not isinstance(func, FUNCTIONS):
            continue
        a = func.args
        for param in [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]:
            arg = pm.argument_for(func, call, param)
            if not isinstance(arg, (ast.Name, ast.Attribute)) or var_key(m, arg) not in wrappers:
                continue
            uses = {id(n) for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == param}
            for save in pm.calls(SAVE):
                if not pm.contains(func, save):
                    continue
                parts = {id(x) for x in saved_parts(pm, save) if isinstance(x, ast.Name) and x.id == param}
                if parts and parts == uses:
                    out.append((call, arg, f"{rel}:{save.lineno}"))
                    break
    return out


def loaded_values(m: SemanticModel) -> Set[int]:
    """ids of the ``torch.load(...)`` calls of the module."""
    return {id(c) for c in m.calls(LOAD)}


def wrapper_restored(m: SemanticModel, wrappers: Set[VarKey]) -> List[ast.AST]:
    """Assignments to a wrapper variable whose value comes from ``torch.load``
    (``net = torch.load(path)``, ``net = checkpoint["net"]``) that may run after the wrap
    (:func:`restored_before_wrap` tells the others apart)."""
    return [a for a in _restorations(m, wrappers) if not restored_before_wrap(m, a)]


def restored_before_wrap(m: SemanticModel, assign: ast.AST) -> bool:
    """The loaded object is assigned before every DataParallel wrap of the script runs
    (fixup's ``if args.resume: net = checkpoint["net"]`` above ``net = DataParallel(net)``):
    in the same function, earlier, and in no loop that also holds a wrap. The wrap then
    takes the loaded object, which the migration's own checkpoints hold bare."""
    from dp2ddp.model.wrap_context import in_exiting_branch
    from dp2ddp.model.wraps import dp_wraps

    wraps = [w for w in dp_wraps(m) if not w.functional and not (w.stmt is not None and in_exiting_branch(m, w))]
    if not wraps:
        return False
    return all(m.runs_before(assign, w.stmt) for w in wraps)


def restored_before(m: SemanticModel, wrappers: Set[VarKey]) -> List[ast.AST]:
    """The assignments of :func:`wrapper_restored`'s kind that run before the wrap."""
    return [a for a in _restorations(m, wrappers) if restored_before_wrap(m, a)]


def _restorations(m: SemanticModel, wrappers: Set[VarKey]) -> List[ast.AST]:
    from dp2ddp.model.flow import origins

    loads = loaded_values(m)
    if not loads:
        return []
    out = []
    for node in m.nodes(ast.Assign):
        if len(node.targets) != 1 or var_key(m, node.targets[0]) not in wrappers:
            continue
        for origin, _path in origins(m, node.value):
            if id(origin) in loads:
                out.append(node)
                break
    return out
