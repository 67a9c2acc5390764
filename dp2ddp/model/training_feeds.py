"""Which values feed the script's training loops, and where they were made.

What a training loop (:func:`dp2ddp.model.training.training_loops`) iterates feeds
training: ``for x, y in loader``, ``enumerate(tqdm(loader))``, ``zip(src_loader,
tgt_loader)`` (every argument), ``itertools.cycle/chain/islice``, ``next(iter(loader))``
inside the loop (:func:`fed_values`, through the iterator wrappers: :func:`iterated`).

:func:`trained_origins` follows those values back to where they were made
(:mod:`dp2ddp.model.flow`: names, parameters, ``self`` attributes, containers, returns),
also when the script hands them to a ``train()`` of a project module
(:func:`handed_params`). A loader is a training loader when its construction is among
them (:mod:`dp2ddp.model.loaders`), whatever it is called.
"""

from __future__ import annotations

import ast
from typing import Iterator, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.phase_keys import fed_origins
from dp2ddp.model.project_defs import project_def, project_defs
from dp2ddp.model.syntax import terminal
from dp2ddp.model.training import training_loops, updates

from dp2ddp.model.flow import ALL_ARGS  # iterator wrappers whose arguments are all iterated


# iterator wrappers that iterate their first argument
FIRST_ARG = {"enumerate", "tqdm", "iter", "progress_bar", "track", "cycle", "islice", "prefetch", "Bar", "ProgressBar", "IncrementalBar"}


def iterated(expr: ast.AST) -> Iterator[ast.AST]:
    """The values a ``for`` over ``expr`` iterates, through the iterator wrappers."""
    if isinstance(expr, ast.Call) and expr.args:
        name = terminal(expr.func)
        if name in ALL_ARGS:
            for a in expr.args:
                # ``zip(*iterators)``: each element of the container is iterated; the container
                # stands for them (its origins are what made them, or what no loader made)
                yield from iterated(a.value if isinstance(a, ast.Starred) else a)
            return
        if name in FIRST_ARG and not isinstance(expr.args[0], ast.Starred):
            yield from iterated(expr.args[0])
            return
    yield expr


# what a training loop may iterate besides data: epochs and index ranges (hand batching is
# another transform's business), numbers, literals
NOT_DATA = frozenset({"range", "xrange", "trange", "len", "count", "repeat", "int", "float"})


# methods that hand a training loop its next batch from loaders an object keeps
BATCH_GETTERS = frozenset({"get_batch", "next_batch", "get_next_batch", "sample_batch"})


def fed_values(m: SemanticModel) -> List[Tuple[ast.AST, ast.AST]]:
    """``(value, training loop)``: each value a training loop iterates (``for``) or pulls
    batches from (``next(iter(x))``, ``next(it)`` of ``it = iter(x)``, ``x.get_batch()``:
    deep-text-recognition's ``Batch_Balanced_Dataset``, whose loaders live inside it) inside
    its body."""
    got = m.cache.get("training:fed")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.AST, ast.AST]] = []
    for loop in training_loops(m):
        if not updates(m, loop):
            continue  # gradients for something else (an attack's input): whole on every rank
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            out.extend((v, loop) for v in iterated(loop.iter))
        for stmt in loop.body:  # type: ignore[attr-defined]
            for n in ast.walk(stmt):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "next" and n.args:
                    inner = n.args[0]
                    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "iter" and inner.args:
                        inner = inner.args[0]
                    out.extend((v, loop) for v in iterated(inner))
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in BATCH_GETTERS
                      and not n.args and not n.keywords):
                    out.extend((v, loop) for v in iterated(n.func.value))
    m.cache["training:fed"] = out
    return out


def handed_values(m: SemanticModel) -> List[Tuple[ast.AST, ast.Call]]:
    """``(value, call)``: each value the script hands to a project module's function or
    class (``Trainer(model, data_loader=loader)``) whose training loop iterates the parameter
    it binds (itself, or through ``self.data_loader`` in the class's methods)."""
    return [(v, h.call) for h in handed_params(m) for v in iterated(h.arg)]


class Handed(NamedTuple):
    call: ast.Call  # the call in this script (``Trainer(model, loader)``)
    module: SemanticModel  # the project module it calls into
    function: ast.AST  # the function there that binds the parameter (a class's ``__init__``)
    param: str  # the parameter a training loop of that module iterates
    arg: ast.AST  # what this call passes for it


def handed_params(m: SemanticModel) -> List[Handed]:
    """The parameters of project modules' functions and classes that this script hands a
    value a training loop there iterates (see :func:`handed_values`)."""
    got = m.cache.get("training:handed")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Handed] = []
    for call in m.nodes(ast.Call):
        if m.resolve_call(call) is not None:
            continue
        # ``trainer.train(loader)`` where ``trainer`` is one of two project classes on different
        # paths (adversarial_robustness' ``WATrainer`` or ``Trainer``): each one's method
        for pm, func, _ in project_defs(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else ():
            if isinstance(func, ast.ClassDef):
                # ``Trainer(model, loader)``: a parameter of its __init__ that a training loop of
                # the class iterates (through ``self.data``)
                init = pm.methods(func).get("__init__")
                if init is None:
                    continue
                params = _fed_params(pm, init, within=func)
                func = init
            else:
                params = _fed_params(pm, func)
            for param in params:
                arg = pm.argument_for(func, call, param)
                if arg is not None:
                    out.append(Handed(call, pm, func, param, arg))
    m.cache["training:handed"] = out
    return out


def handed_to_either(m: SemanticModel) -> List[Tuple[ast.Call, ast.AST, str, str]]:
    """``runner.run(loader)`` where ``runner`` is one of several project classes on different
    paths and the argument feeds a training loop in one class's method but not in another's
    (``Trainer(net) if not args.test else Tester(net)``): ``(call, argument, the method that
    trains on it, one that does not)``. Sharded for the training path, the other path would
    evaluate each rank's share only."""
    from dp2ddp.model.training import trains

    out: List[Tuple[ast.Call, ast.AST, str, str]] = []
    handed = {(id(h.call), id(h.arg)) for h in handed_params(m)}
    for call in m.nodes(ast.Call):
        if not isinstance(call.func, ast.Attribute):
            continue
        defs = project_defs(m, call.func)
        if len(defs) < 2:
            continue
        for arg in list(call.args) + [k.value for k in call.keywords]:
            if (id(call), id(arg)) not in handed:
                continue
            fed_in, idle_in = None, None
            for pm, func, _ in defs:
                if isinstance(func, ast.ClassDef):
                    continue
                owner = pm.enclosing_class(func)
                name = f"{owner.name}.{func.name}" if owner is not None else func.name  # type: ignore[attr-defined]
                fed = _fed_params(pm, func)
                if any(p in fed for p in pm.params(func) if pm.argument_for(func, call, p) is arg):
                    fed_in = fed_in or name
                elif not trains(pm, func):
                    idle_in = idle_in or name  # no backward pass it reaches: it only reads the value
            if fed_in and idle_in:
                out.append((call, arg, fed_in, idle_in))
    return out


def trained_origins(m: SemanticModel) -> Set[Tuple[int, tuple]]:
    """``(id(node), path)`` of every origin (:func:`dp2ddp.model.flow.origins`) of a value that
    feeds a training loop: the loader constructions (or helper calls, with the position of
    the loader in what they return) behind ``for batch in ...`` of every training loop, also
    of a project module's function the script hands the value to."""
    from dp2ddp.model.flow import origins

    got = m.cache.get("training:origins")
    if got is not None:
        return got  # type: ignore[return-value]
    out: Set[Tuple[int, tuple]] = set()
    todo: List[Tuple[ast.AST, Optional[ast.AST]]] = list(fed_values(m)) + [(v, None) for v, _ in handed_values(m)]
    while todo:
        value, loop = todo.pop()
        for node, path in (fed_origins(m, value, loop) if loop is not None else origins(m, value)):
            if (id(node), path) in out:
                continue
            out.add((id(node), path))
            todo.extend((v, None) for v in yielded_values(m, node))
    m.cache["training:origins"] = out
    return out


def yielded_values(m: SemanticModel, node: ast.AST) -> List[ast.AST]:
    """A call of a generator function of this module (``sample_data(path, bs)`` that
    builds a DataLoader and yields ``next(loader)`` forever): what it yields comes from the
    values its ``yield`` expressions pull batches from — iterating the generator iterates
    them."""
    if not isinstance(node, ast.Call):
        return []
    func = m.resolve_call(node)
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or func.name == "__init__":
        return []
    out: List[ast.AST] = []
    for n in ast.walk(func):
        if isinstance(n, (ast.Yield, ast.YieldFrom)) and n.value is not None and m.enclosing_function(n) is func:
            v = n.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "next" and v.args:
                v = v.args[0]
            out.extend(iterated(v))
        elif isinstance(n, (ast.For, ast.AsyncFor)) and m.enclosing_function(n) is func and any(
            isinstance(y, (ast.Yield, ast.YieldFrom)) for s in n.body for y in ast.walk(s)
        ):
            out.extend(iterated(n.iter))  # ``for batch in loader: yield batch``
    return out


def _fed_params(pm: SemanticModel, func: ast.AST, within: Optional[ast.AST] = None) -> Set[str]:
    """Parameters of ``func`` (in project module ``pm``) whose value feeds one of its
    training loops — or, with ``within`` (a class, ``func`` its ``__init__``), a training
    loop of any of the class's methods (the value kept on ``self``)."""
    from dp2ddp.model.flow import origins

    params = set(pm.params(func))
    out = set()
    for v, loop in fed_values(pm):
        if within is not None:
            if not pm.contains(within, loop):
                continue
        elif pm.enclosing_function(loop) is not func:
            continue
        for node, _ in origins(pm, v):
            if isinstance(node, ast.Name) and node.id in params and pm.enclosing_function(node) is func:
                out.add(node.id)
    return out
