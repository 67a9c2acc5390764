"""Training in project code over data that code finds itself.

The script calls a project function or class whose training loop iterates a loader made
there (:func:`foreign_training`), or hands the DataParallel model to project code that
loops over data it reads out of an object or makes itself and runs a backward pass
(:func:`handed_trainers`): the script never sees that loader, so nothing it does shards it.
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import terminal
from dp2ddp.model.training import is_backward
from dp2ddp.model.training_feeds import NOT_DATA, fed_values


class Foreign(NamedTuple):
    """A call of the script into project code that trains on a value made there."""

    call: ast.Call  # the call in this script (``engine.fit(model)``)
    module: str  # the path of the project module whose loop trains
    loop: str  # ``engine.py:10``: the training loop
    value: str  # what it iterates (``loader``)
    made: str  # ``engine.py:7``: where that value is made


def foreign_training(m: SemanticModel) -> List[Foreign]:
    """Calls of a project function or class whose run reaches a training loop in a project
    module (up to three modules further: :func:`dp2ddp.model.project_defs.reach_across`) that
    iterates a value made there (a ``DataLoader(...)`` or any other call of that module),
    not one its callers pass in: the script never sees that loader, so nothing it does
    shards it. A parameter's value is the caller's (:func:`handed_params` for the script's
    own calls)."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.project_defs import project_calls, reach_across

    got = m.cache.get("training:foreign")
    if got is not None:
        return got  # type: ignore[return-value]
    def first(call, pm, node, rel) -> Optional[Foreign]:
        for mod, fn, path in reach_across(pm, node, rel):
            for value, loop in fed_values(mod):
                if mod.enclosing_function(loop) is not fn:
                    continue
                for made, _ in origins(mod, value):
                    if isinstance(made, ast.Call) and terminal(made.func) not in NOT_DATA:
                        return Foreign(call, mod.path, f"{path}:{loop.lineno}", mod.source(value), f"{path}:{made.lineno}")
        return None

    out = [f for call, (pm, node, rel) in project_calls(m) if (f := first(call, pm, node, rel)) is not None]
    m.cache["training:foreign"] = out
    return out


class HandedTrainer(NamedTuple):
    """A call that hands the DataParallel model to project code that trains it over data it
    gets elsewhere (a re-ID library's engine over its data manager's loader)."""

    call: ast.Call  # the call in this module (``RegressionEngine(datamanager, model, optimizer)``)
    module: str  # the path of the project module the call reaches
    loop: str  # ``engine.py:17``: a loop over data in that code
    step: str  # ``regression.py:11``: a backward pass in that code


_NOT_DATA_LOOPS = frozenset({"range", "trange"})


def handed_trainers(m: SemanticModel) -> List[HandedTrainer]:
    """Calls of a project class or function (in another module) given the DataParallel
    model, whose code (a class with its bases, across modules; a function with what it runs:
    :func:`dp2ddp.model.project_defs.reach_across`) both loops over data it finds itself
    (:func:`_data_it_finds`: read out of an object, or made there) and runs a backward pass.
    The caller decides whether a loader it shards is handed in beside the model
    (``loader_handoffs.handed_trainer_refusals``)."""
    from dp2ddp.model.project_defs import class_of_call, project_def, reach_across
    from dp2ddp.model.uses import dp_wrapper_uses

    got = m.cache.get("training:handed_trainers")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[HandedTrainer] = []
    seen: set = set()
    for u in dp_wrapper_uses(m):
        call = m.parent(u.node)
        if isinstance(call, ast.keyword):
            call = m.parent(call)
        if not isinstance(call, ast.Call) or call.func is u.node or id(call) in seen:
            continue
        if not (any(a is u.node for a in call.args) or any(k.value is u.node for k in call.keywords)):
            continue
        seen.add(id(call))
        found = class_of_call(m, call) or (project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None)
        if found is None or not found[2]:
            continue  # not a project module's (the script's own functions are read where they are)
        pm, node, rel = found
        functions = _class_functions(pm, node, rel, 0) if isinstance(node, ast.ClassDef) else reach_across(pm, node, rel)
        loop = next(((fm, n, path) for fm, fn, path in functions for n in ast.walk(fn)
                     if isinstance(n, (ast.For, ast.AsyncFor)) and _data_it_finds(fm, n)), None)
        step = next(((fm, n, path) for fm, fn, path in functions for n in ast.walk(fn)
                     if isinstance(n, ast.Call) and is_backward(n)), None)
        if loop is not None and step is not None:
            out.append(HandedTrainer(call, pm.path, f"{loop[2]}:{loop[1].lineno}", f"{step[2]}:{step[1].lineno}"))
    m.cache["training:handed_trainers"] = out
    return out


def _data_it_finds(mod: SemanticModel, loop: ast.AST) -> bool:
    """``loop`` iterates data its own code finds, not data its caller hands in: a loader
    read out of an object (``self.train_loader = self.datamanager.train_loader``) or made
    there (a call of its module); not a parameter (``for x, y in test_loader``), nor a
    ``range``, a ``zip`` or a dict's items (weights, settings)."""
    from dp2ddp.model.flow import origins

    it = loop.iter  # type: ignore[attr-defined]
    while isinstance(it, ast.Call) and terminal(it.func) in ("enumerate", "tqdm") and it.args:
        it = it.args[0]
    if not isinstance(it, (ast.Name, ast.Attribute)):
        return False
    for node, _path in origins(mod, it):
        if isinstance(node, ast.Attribute):
            return True
        if isinstance(node, ast.Call) and terminal(node.func) not in NOT_DATA and terminal(node.func) not in _NOT_DATA_LOOPS:
            return True
    return False


def _class_functions(pm: SemanticModel, cls: ast.ClassDef, rel: str, depth: int):
    """Every method of ``cls`` and of its bases (in its module, or imported from another
    project module), with what each runs, as ``(module, function, path)``."""
    import os

    from dp2ddp.model.project_defs import path_of, project_def, reach_across

    out = []
    for s in cls.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.extend(reach_across(pm, s, rel))
    if depth >= 3:
        return out
    for b in cls.bases:
        local = pm.classes.get(b.id) if isinstance(b, ast.Name) else None
        if isinstance(local, ast.ClassDef):
            out.extend(_class_functions(pm, local, rel, depth + 1))
            continue
        found = project_def(pm, b) if isinstance(b, (ast.Name, ast.Attribute)) else None
        if found is not None and isinstance(found[1], ast.ClassDef):
            out.extend(_class_functions(found[0], found[1], path_of(found, pm, rel), depth + 1))
    return out


def unfollowed_trainers(m: SemanticModel) -> List[ast.Call]:
    """Calls handed the DataParallel model whose callee is picked at run time (a class picked
    from a dict: ``trainer_dict[cfg.SOLVER.TRAINER](name, distiller, train_loader, ...)``, or
    returned by a call: ``get_trainer(cfg)(...)``), in
    a script with no backward pass of its own: the training happens in that callee, and
    whether its loaders are sharded, its writes made once, cannot be told."""
    from dp2ddp.model.project_defs import class_of_call
    from dp2ddp.model.steps import backward_calls
    from dp2ddp.model.uses import dp_wrapper_uses

    if backward_calls(m):
        return []
    out: List[ast.Call] = []
    for u in dp_wrapper_uses(m):
        call = m.parent(u.node)
        if isinstance(call, ast.keyword):
            call = m.parent(call)
        if not isinstance(call, ast.Call) or call.func is u.node or call in out:
            continue
        if not (any(a is u.node for a in call.args) or any(k.value is u.node for k in call.keywords)):
            continue
        if not isinstance(call.func, (ast.Subscript, ast.Call)) or class_of_call(m, call) is not None:
            continue  # a callee named in the code (a method of an object: read where it is known)
        out.append(call)
    return out
