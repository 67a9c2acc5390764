"""Where the script trains, and which values feed its training steps.

A *training loop* is a loop whose body reaches a ``.backward()`` call — in the loop
itself, in a function of this module it calls (methods through ``self`` and their
overrides included), or in a function of a project module it calls. What such a loop
iterates feeds training: ``for x, y in loader``, ``enumerate(tqdm(loader))``,
``zip(src_loader, tgt_loader)`` (every argument), ``itertools.cycle/chain/islice``,
``next(iter(loader))`` inside the loop.

:func:`trained_origins` follows those values back to where they were made
(:mod:`dp2ddp.model.flow`: names, parameters, ``self`` attributes, containers, returns),
also when the script hands them to a ``train()`` of a project module. A loader is a
training loader when its construction is among them (:mod:`dp2ddp.model.loaders`),
whatever it is called.
"""

from __future__ import annotations

import ast
from typing import Iterator, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.project_defs import project_def
from dp2ddp.model.call_args import SET_GRAD_ENABLED_PARAMS, argument
from dp2ddp.model.syntax import is_const, terminal

from dp2ddp.model.flow import ALL_ARGS  # iterator wrappers whose arguments are all iterated

# iterator wrappers that iterate their first argument
FIRST_ARG = {"enumerate", "tqdm", "iter", "progress_bar", "track", "cycle", "islice", "prefetch", "Bar", "ProgressBar", "IncrementalBar"}


NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})


def under_no_grad(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` runs with gradients off: inside ``with torch.no_grad():`` (or
    ``inference_mode()``, ``set_grad_enabled(False)``), or in a function decorated
    ``@torch.no_grad()`` / ``@torch.inference_mode()``."""
    for a in m.ancestors(node):
        if isinstance(a, (ast.With, ast.AsyncWith)):
            for item in a.items:
                e = item.context_expr
                if isinstance(e, ast.Call) and m.is_name(e.func, NO_GRAD):
                    return True
                if isinstance(e, ast.Call) and m.is_name(e.func, {"torch.set_grad_enabled"}) and is_const(
                        argument(e, SET_GRAD_ENABLED_PARAMS, "mode"), False):
                    return True
        elif isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in a.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if m.is_name(target, NO_GRAD):
                    return True
    return False


def is_backward(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "backward"


def _project_trains(m: SemanticModel, call: ast.Call, depth: int = 0) -> bool:
    """``call`` reaches a function of a project module that (itself, or through what it
    calls in its module) calls ``.backward()``."""
    return _project_reaches(m, call, "trains", is_backward, False, depth)


def trains(m: SemanticModel, node: ast.AST, depth: int = 0) -> bool:
    """Code at ``node`` (a loop, a function) reaches a ``.backward()``."""
    return _reaches(m, node, "trains", is_backward, False, depth)


def _reaches(m: SemanticModel, node: ast.AST, kind: str, pred, own: bool, depth: int) -> bool:
    """Code at ``node`` makes a call ``pred`` accepts: in the functions of this module it
    reaches (and, with ``own``, in ``node``'s own nodes: a statement), or, two modules deep,
    in a project module's function it calls. Memoised per model under ``kind``."""
    memo = m.cache.setdefault(f"training:{kind}", {})
    key = id(node)
    if key in memo:  # type: ignore[operator]
        return memo[key]  # type: ignore[index]
    memo[key] = False  # type: ignore[index]
    calls = ([n for n in ast.walk(node) if isinstance(n, ast.Call)] if own else []) + list(m.reached_calls(node))
    got = any(pred(c) for c in calls)
    if not got and depth < 2:
        got = any(_project_reaches(m, c, kind, pred, own, depth) for c in calls if m.resolve_call(c) is None)
    memo[key] = got  # type: ignore[index]
    return got


def _project_reaches(m: SemanticModel, call: ast.Call, kind: str, pred, own: bool, depth: int) -> bool:
    found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
    if found is None or isinstance(found[1], ast.ClassDef):
        return False
    return _reaches(found[0], found[1], kind, pred, own, depth + 1)


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


def training_loops(m: SemanticModel) -> List[ast.AST]:
    """Loops whose body reaches a ``.backward()``, innermost first where they nest."""
    got = m.cache.get("training:loops")
    if got is None:
        got = [lp for lp in m.nodes(ast.For, ast.AsyncFor, ast.While) if _body_trains(m, lp)]
        m.cache["training:loops"] = got
    return got  # type: ignore[return-value]


def _body_trains(m: SemanticModel, loop: ast.AST) -> bool:
    for stmt in loop.body:  # type: ignore[attr-defined]
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                if is_backward(n):
                    return True
                t = m.resolve_call(n)
                if t is not None and trains(m, t):
                    return True
                if t is None and _project_trains(m, n):
                    return True
    return False


def _is_update(call: ast.Call) -> bool:
    """``optimizer.step()``, ``scaler.step(optimizer)``, ``optimizerD.step()``: a call of
    a ``step`` method, or a pass over the parameters (``for p in model.parameters():``, the
    hand-written SGD of the word language model)."""
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("step", "parameters", "named_parameters")


def _reaches_update(m: SemanticModel, node: ast.AST) -> bool:
    return _reaches(m, node, "updates", _is_update, True, 0)


def updates(m: SemanticModel, loop: ast.AST) -> bool:
    """A training loop whose passes change the parameters: it reaches an update
    (:func:`_is_update`), or one follows it in its function (``for x in loader:
    loss.backward()`` then ``optimizer.step()``: the whole pass accumulates). A loop that
    only reaches ``.backward()`` computes gradients for something else — an adversarial
    attack's input in an evaluation loop — and its data stays whole on every rank (every
    rank's gradients are then the same: correct, not sped up)."""
    if _reaches_update(m, loop):
        return True
    node = loop
    for a in m.ancestors(loop):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(a, field, None)
            if isinstance(block, list) and any(s is node for s in block):
                after = block[[id(s) for s in block].index(id(node)) + 1:]
                if any(_reaches_update(m, s) for s in after):
                    return True
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            break
        node = a
    return False


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
        found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
        if found is None:
            continue
        pm, func, _ = found
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


# ---------------------------------------------------------------------- loaders by phase
# ``for phase in ["train", "val"]: ... for batch in loaders[phase]: ... if phase == "train":
# loss.backward()``: one loop trains on some keys of a dict of loaders and evaluates on the
# others. The keys it trains on are those under which a backward pass can run.


def keyed_feed(m: SemanticModel, value: ast.AST, loop: ast.AST):
    """``(container, key loop)`` where ``value`` (fed to training ``loop``) is one item of a
    dict chosen by a key loop: ``loaders[phase]``, ``loader`` of ``for phase, loader in
    loaders.items()``, or the ``loaders.items()`` / ``loaders.values()`` the key loop
    walks itself; else ``None``."""
    from dp2ddp.model.flow import binding_loop, key_loop

    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Name):
        kl = binding_loop(m, value.slice)
        if kl is not None and kl.key == value.slice.id:
            return value.value, kl
    if isinstance(value, ast.Name):
        kl = binding_loop(m, value)
        if kl is not None and kl.value == value.id and kl.container is not None:
            return kl.container, kl
    kl = key_loop(m, loop)
    if kl is not None and kl.container is not None and getattr(loop, "iter", None) is value:
        return kl.container, kl
    return None


def _key_test(m: SemanticModel, test: ast.AST, name: str, key: object, depth: int = 0) -> Optional[bool]:
    """``test`` evaluated with ``name`` bound to ``key``: ``True``/``False``, or ``None``
    where it depends on anything else."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        got = _key_test(m, test.operand, name, key, depth)
        return None if got is None else not got
    if isinstance(test, ast.BoolOp):
        parts = [_key_test(m, v, name, key, depth) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in parts else True if all(p is True for p in parts) else None
        return True if True in parts else False if all(p is False for p in parts) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(right, ast.Name) and right.id == name and isinstance(left, ast.Constant):
            left, right = right, left
        if not (isinstance(left, ast.Name) and left.id == name):
            return None
        if isinstance(right, ast.Constant):
            if isinstance(op, (ast.Eq, ast.Is)):
                return key == right.value
            if isinstance(op, (ast.NotEq, ast.IsNot)):
                return key != right.value
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.List, ast.Tuple, ast.Set)) and all(
            isinstance(x, ast.Constant) for x in right.elts
        ):
            inside = key in [x.value for x in right.elts]  # type: ignore[attr-defined]
            return inside if isinstance(op, ast.In) else not inside
        return None
    if isinstance(test, ast.Name) and depth < 2:
        # ``train = phase == "train"`` then ``if train:``
        _, bindings = m.lookup(test.id, m.scope_of(test))
        if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].value is not None:
            return _key_test(m, bindings[0].value, name, key, depth + 1)
    return None


def _training_calls(m: SemanticModel, node: ast.AST) -> List[ast.Call]:
    """The calls in ``node`` that run a backward pass: ``.backward()``, or a function of the
    script or the project that reaches one."""
    out = []
    for n in ast.walk(node):
        if not isinstance(n, ast.Call):
            continue
        if is_backward(n):
            out.append(n)
            continue
        t = m.resolve_call(n)
        if (t is not None and trains(m, t)) or (t is None and _project_trains(m, n)):
            out.append(n)
    return out


def _update_calls(m: SemanticModel, node: ast.AST) -> List[ast.Call]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            t = m.resolve_call(n)
            if _is_update(n) or (t is not None and _reaches_update(m, t)):
                out.append(n)
    return out


def trained_keys(m: SemanticModel, kl) -> Tuple[object, ...]:
    """The keys of key loop ``kl`` under which its body trains: a backward pass and an
    optimizer step can run (no ``if`` around them, between the key loop and the call, is
    false for that key). A backward pass alone (an attack on the inputs, evaluated on every
    phase) does not train; where the loop holds no step at all (it follows the loop), the
    backward passes decide."""
    backward = _reachable_keys(m, kl, _training_calls(m, kl.loop))
    updates = _update_calls(m, kl.loop)
    if not updates:
        return backward
    both = tuple(k for k in _reachable_keys(m, kl, updates) if k in backward)
    return both or backward


def _reachable_keys(m: SemanticModel, kl, calls: List[ast.Call]) -> Tuple[object, ...]:
    """The keys of ``kl`` under which one of ``calls`` can run."""
    out = []
    for key in kl.keys:
        for call in calls:
            reachable = True
            child: ast.AST = call
            for a in m.ancestors(call):
                if a is kl.loop:
                    break
                if isinstance(a, (ast.If, ast.IfExp)):
                    got = _key_test(m, a.test, kl.key, key)
                    in_body = any(child is s for s in a.body) if isinstance(a, ast.If) else child is a.body
                    in_else = any(child is s for s in a.orelse) if isinstance(a, ast.If) else child is a.orelse
                    if (in_body and got is False) or (in_else and got is True):
                        reachable = False
                        break
                child = a
            if reachable:
                out.append(key)
                break
    return tuple(out)


def fed_origins(m: SemanticModel, value: ast.AST, loop: ast.AST) -> List[Tuple[ast.AST, tuple]]:
    """:func:`dp2ddp.model.flow.origins` of ``value`` as training ``loop`` feeds on it: an item
    of a dict chosen by a key loop (:func:`keyed_feed`) is followed only for the keys that
    train (:func:`trained_keys`): ``loaders["val"]`` of a phase loop that steps only when
    ``phase == "train"`` is evaluation, whole on every rank."""
    from dp2ddp.model.flow import item_origins, origins

    got = keyed_feed(m, value, loop)
    if got is None:
        return origins(m, value)
    container, kl = got
    return item_origins(m, container, trained_keys(m, kl))


# ---------------------------------------------------------------------- loops over settings
# ``for width_mult in sorted(FLAGS.width_mult_list, reverse=True): model.apply(...);
# loss = ...; loss.backward()`` inside the batch loop (slimmable networks): a training loop
# over a list of numbers, not over data. Every rank runs every item, as the one process of
# the original did; the model may be set up differently for each (a BatchNorm per width),
# so a pass may leave parameters unused that the next one uses.


class SettingsLoop(NamedTuple):
    loop: ast.AST  # ``for width_mult in widths: ...`` (a training loop)
    value: ast.AST  # what it iterates
    same: bool  # its items are the same on every rank (built from constants, options, imports)
    unsure: Optional[ast.AST]  # where not: the value dp2ddp cannot show the same (``random.uniform(...)``)
    within: Optional[ast.AST]  # the training loop around it, when it runs several backward passes per step of that loop


def settings_loops(m: SemanticModel) -> List[SettingsLoop]:
    """Training loops over values that are not data: not a loader, a range or a counter, but
    a list of settings (numbers, names) built from constants, the script's options and
    imported configuration, with nothing else put in it — also where one of those cannot be
    shown the same on every rank (``unsure``: a random draw appended), which a migration must
    refuse. A loop over the keys of a dict of loaders (a phase loop) is not one of them."""
    got = m.cache.get("training:settings")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.flow import container_mutations, key_loop, origins
    from dp2ddp.model.handles import expr_handle
    from dp2ddp.model.names import DATALOADER
    from dp2ddp.model.rank_alike import same_on_every_rank

    keyed = {id(kl.loop) for v, lp in fed_values(m) if (g := keyed_feed(m, v, lp)) is not None for kl in [g[1]]}
    out: List[SettingsLoop] = []
    for loop in training_loops(m):
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or id(loop) in keyed:
            continue
        values = list(iterated(loop.iter))
        if len(values) != 1 or (isinstance(values[0], ast.Call) and terminal(values[0].func) in NOT_DATA):
            continue
        value = values[0]
        kl = key_loop(m, loop)
        if kl is not None and kl.container is not None:
            continue  # the keys or items of a dict
        found = origins(m, value)
        if any((isinstance(n, ast.Call) and m.call_is(n, DATALOADER)) or isinstance(n, ast.DictComp) for n, _ in found):
            continue  # loaders
        unsure = None
        pieces = [value] + [n for n, p in found if not p]
        for piece in pieces:
            h = expr_handle(m, piece) if isinstance(piece, (ast.Name, ast.Attribute)) else None
            added = container_mutations(m).get(h, []) if h is not None else []
            for x in [piece] + list(added):
                if x is piece and isinstance(piece, ast.Name) and added:
                    continue  # a list built by appends: judged by what is appended
                if not _same_settings(m, x, same_on_every_rank):
                    unsure = x
                    break
            if unsure is not None:
                break
        if not _settings_shaped(m, found):
            continue
        out.append(SettingsLoop(loop, value, unsure is None, unsure, _passes_within(m, loop)))
    m.cache["training:settings"] = out
    return out


def _same_settings(m: SemanticModel, x: ast.AST, same, depth: int = 0) -> bool:
    """``x`` is the same on every rank; a list built from such lists (``[a, b] + rest``)."""
    if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Add):
        return _same_settings(m, x.left, same, depth) and _same_settings(m, x.right, same, depth)
    if isinstance(x, ast.Name) and depth < 3:
        from dp2ddp.model.flow import origins

        found = origins(m, x)
        if found and all(not p and n is not x for n, p in found):
            return all(_same_settings(m, n, same, depth + 1) for n, _ in found)
    return same(m, x)


def _settings_shaped(m: SemanticModel, found) -> bool:
    """What a loop iterates looks like settings, not batches: a list literal, an attribute of
    an options or configuration object, a sum of such lists (``[lo, hi] + drawn``)."""
    for n, p in found:
        if p:
            return False
        if not _shaped(n):
            return False
    return bool(found)


def _shaped(n: ast.AST) -> bool:
    """A list literal (of anything but calls), an attribute, or a sum of such lists and names."""
    if isinstance(n, (ast.List, ast.Tuple, ast.Set)):
        return not any(isinstance(x, ast.Call) or isinstance(x, ast.Starred) for x in n.elts)
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
        return all(isinstance(x, ast.Name) or _shaped(x) for x in (n.left, n.right))
    if isinstance(n, ast.Call) and terminal(n.func) in ("list", "tuple", "sorted") and len(n.args) == 1:
        return isinstance(n.args[0], (ast.Name, ast.Attribute))  # ``list(WIDTHS)``
    return isinstance(n, ast.Attribute)


def _passes_within(m: SemanticModel, loop: ast.AST) -> Optional[ast.AST]:
    """The training loop around ``loop`` whose optimizer step follows it: ``loop`` runs
    several forward and backward passes per step."""
    if _reaches_update(m, loop):
        return None
    for outer in m.enclosing_loops(loop):
        if outer is loop:
            continue
        if outer in training_loops(m):
            return outer
        break
    return None


# ------------------------------------------------------------------- does the file train?
# A call that is a training step wherever it stands: a backward pass, an optimizer's step,
# a framework's (``trainer.fit``, ``model.train_step``, TF-style ``minimize``).
STEP_ATTRS = frozenset({"backward", "step", "minimize", "fit", "train_step", "optimize_parameters"})
GRAD_CALLS = frozenset({"torch.autograd.backward", "torch.autograd.grad"})


def _is_step(m: SemanticModel, call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr in STEP_ATTRS) or m.is_name(f, GRAD_CALLS)


class TrainingSite(NamedTuple):
    """Where a module trains: ``line`` of its call; ``where``: ``""`` for a step in the
    module itself, else ``module.py:N``, the step in the project code that call reaches."""

    line: int
    where: str


def training_site(m: SemanticModel) -> Optional[TrainingSite]:
    """The first place this module trains (``None``: nowhere): a training step in its own
    code (:data:`STEP_ATTRS`, ``torch.autograd.grad``), or a call of the project's own code
    (a function, a class, a method of a project object, also one held first:
    ``trainer = model.train; trainer(args)``) whose run reaches a backward pass in a project module
    (up to three modules further: :func:`dp2ddp.model.project_defs.reach_across`). Only a
    module with no such site is inference-only (DDP115)."""
    if "training:site" in m.cache:
        return m.cache["training:site"]  # type: ignore[return-value]
    got: Optional[TrainingSite] = None
    own = next((c for c in m.nodes(ast.Call) if _is_step(m, c)), None)
    if own is not None:
        got = TrainingSite(own.lineno, "")
    else:
        got = _project_site(m)
    m.cache["training:site"] = got
    return got


def _project_site(m: SemanticModel) -> Optional[TrainingSite]:
    from dp2ddp.model.flow import origins
    from dp2ddp.model.project_defs import class_of_call, method_of, project_calls, reach_across

    found = [(call, hit) for call, hit in project_calls(m)]
    seen = {id(call) for call, _ in found}
    for call in m.nodes(ast.Call):  # a project method held by a name first: ``trainer = model.train``
        if id(call) in seen or not isinstance(call.func, ast.Name):
            continue
        for node, path in origins(m, call.func):
            hit = project_def(m, node) if not path and isinstance(node, (ast.Name, ast.Attribute)) else None
            if hit is not None and not isinstance(hit[1], ast.ClassDef):
                found.append((call, hit))
                break
            made = class_of_call(m, node) if not path and isinstance(node, ast.Call) else None
            if made is not None and made[2]:  # an object of a project class, called: its ``__call__``
                # (``compute_loss_fct = MultipleChoiceLossCompute(crit, crit, coef, opt)``, then
                # ``compute_loss_fct(X, Y, M, logits)`` backward and steps in loss.py)
                method = method_of(made[0], made[1], "__call__", 0)
                if method is not None:
                    found.append((call, (made[0], method, made[2])))
                    break
    from dp2ddp.model.steps import is_backward as backward

    for call, (pm, node, rel) in sorted(found, key=lambda t: (t[0].lineno, t[0].col_offset)):
        for mod, fn, path in reach_across(pm, node, rel):
            # in the project's code only a backward pass: a ``.step()`` there may be a
            # scheduler's, ``torch.autograd.grad`` may tune a number (a temperature), not train
            step = next((c for c in ast.walk(fn) if isinstance(c, ast.Call) and backward(mod, c)), None)
            if step is not None:
                return TrainingSite(call.lineno, f"{path}:{step.lineno}")
    return None


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
    (``shard_loaders._handed_trainers``)."""
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

    from dp2ddp.model.project_defs import project_def, reach_across

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
            path = os.path.normpath(os.path.join(os.path.dirname(rel), found[2]))
            out.extend(_class_functions(found[0], found[1], path, depth + 1))
    return out


def statistic_loops(m: SemanticModel, loaders: List[ast.Call]) -> List[Tuple[ast.For, ast.Call]]:
    """Loops over one of ``loaders`` (the DataLoader calls the migration shards; the loader
    itself, not a value of its batches: ``for ref in ref_imgs``) that only compute a statistic
    of its batches (class weights or a mean over the training set before training:
    deep-person-reid's attribute recognition sums its labels over ``trainloader``), with the
    loader each reads. Not one: a training loop or one inside it (its steps may be a model
    class's methods), a loop that ``break``s (a peek at the first batch), one that runs the
    model or runs under ``no_grad`` (an evaluation over the training set, whose metric each
    rank reports over its share: a number printed, not a value training uses), or one that
    calls anything but arithmetic on its batch (:func:`_only_batch_arithmetic`)."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.uses import dp_wrapper_uses

    calls = {id(c): c for c in loaders}
    training = {id(lp) for lp in training_loops(m)}
    out: List[Tuple[ast.For, ast.Call]] = []
    for loop in m.nodes(ast.For):
        hit = next((calls[id(n)] for v in iterated(loop.iter) for n, path in origins(m, v) if id(n) in calls and not path), None)  # type: ignore[attr-defined]
        if hit is None or id(loop) in training or trains(m, loop) or under_no_grad(m, loop):
            continue
        if any(isinstance(a, ast.For) and (id(a) in training or trains(m, a)) for a in m.ancestors(loop)):
            continue
        if any(isinstance(s, ast.Break) for s in loop.body):  # type: ignore[attr-defined]
            continue
        if any(u.kind == "forward" and m.contains(loop, u.node) for u in dp_wrapper_uses(m)):
            continue
        if _only_batch_arithmetic(m, loop):  # type: ignore[arg-type]
            out.append((loop, hit))  # type: ignore[arg-type]
    return out


def _only_batch_arithmetic(m: SemanticModel, loop: ast.For) -> bool:
    """Every call in ``loop`` is arithmetic on its batch: a method of a value the loop binds
    (``attrs.sum(0)``), or a function of torch, numpy, math or the builtins."""
    local = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for c in ast.walk(loop):
        if not isinstance(c, ast.Call):
            continue
        f = c.func
        if isinstance(f, ast.Attribute):
            root = f.value
            while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in local:
                continue
        q = m.qualified_names(f)
        if q and all(x.split(".", 1)[0] in ("torch", "numpy", "math", "builtins") for x in q):
            continue
        return False
    return True
