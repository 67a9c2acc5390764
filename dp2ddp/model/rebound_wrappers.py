"""The wrapped value changing after the wrap: the wrapper's name bound to another model (then
trained, or used as the wrapper), or a layer of the wrapped model replaced.

``net = DataParallel(net)`` ... train ... ``net = WideResNet(...)`` ... train again
(hendrycks' GLC: a second phase on a fresh network that the original never wraps). The
migration follows the wrapper by its name (:mod:`dp2ddp.model.uses`), but from the new
binding on the name holds a bare module: under DDP every rank would train its own copy of
it on its share of the data, never synchronised — a run that diverges from the
original's without an error. :func:`rebound_trained` finds such a binding and the training
that reaches the new value, for ``wrap_ddp`` to refuse with both lines (DDP101); likewise a
use of the new value that the migration would route as the wrapper's (``net.load_state_dict``
through ``.module``, which a bare module does not have). :func:`replaced_after_wrap`: a layer
of the wrapped model replaced after the wrap (``net.module.fc = nn.Linear(...)``), which DDP
never synchronises (DDP117).

What counts as the same value: ``x = x.cuda()``, ``x = x.to(d)``, ``x = x.train()`` and the
other methods that return the module itself, a function of the script that hands back the
parameter it was given (``model, hist = train_model(model, ...)``, also one of a project
module: ``model, best, epoch = load_pretrained_models(model, path)``); a new ``DataParallel``
wrap of the name is a wrap of its own. Bindings come from the model's scopes, not from the spelling.
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.kinds import SAME_MODULE
from dp2ddp.model.names import DP, LOAD
from dp2ddp.model.training import training_loops
from dp2ddp.model.uses import classify

# how a statement binds a name for certain when it runs (an ``except ... as`` or a walrus may not)
_BINDS = frozenset({"assign", "unpack", "for", "with", "import", "def", "class"})


class Rebound(NamedTuple):
    binding: ast.stmt  # the statement that binds the wrapper's name to another value
    use: ast.AST  # what reads the new value: a training loop, the call that runs one, or a use
    trains: bool  # ``use`` trains the new value


def _keeps_value(m: SemanticModel, stmt: ast.stmt, name: str) -> bool:
    """``net = net.cuda()``: the name is bound to what it held."""
    v = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in SAME_MODULE:
        v = v.func.value
        if isinstance(v, ast.Name) and v.id == name:
            return True
    return False


def _handed_back(m: SemanticModel, stmt: ast.stmt, name: str) -> bool:
    """``model, hist = train_model(model, ...)``: a function of this script or of a project
    module given ``name`` returns that parameter, unchanged, where ``stmt`` binds ``name`` (on every ``return``)."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)):
        return False
    t = stmt.targets[0]
    if isinstance(t, ast.Name) and t.id == name:
        index: Optional[int] = None
    elif isinstance(t, (ast.Tuple, ast.List)) and any(isinstance(e, ast.Name) and e.id == name for e in t.elts):
        index = next(i for i, e in enumerate(t.elts) if isinstance(e, ast.Name) and e.id == name)
    else:
        return False
    from dp2ddp.model.project_defs import project_def

    func, fm = m.resolve_call(stmt.value), m
    if func is None and isinstance(stmt.value.func, (ast.Name, ast.Attribute)):
        found = project_def(m, stmt.value.func)  # ``load_pretrained_models(model, path)`` of utils/ckpt_util.py
        if found is not None:
            fm, func = found[0], found[1]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    returns = [r for r in ast.walk(func) if isinstance(r, ast.Return) and fm.enclosing_function(r) is func]
    locals_ = set()
    for r in returns:
        v = r.value
        if index is not None:
            v = v.elts[index] if isinstance(v, ast.Tuple) and index < len(v.elts) else None
        if not isinstance(v, ast.Name):
            return False
        locals_.add(v.id)
    if len(locals_) != 1:
        return False
    param = locals_.pop()
    arg = fm.argument_for(func, stmt.value, param) if param in fm.params(func) else None
    scope = fm.scopes.get(func)
    bound = scope.bindings.get(param, []) if scope is not None else []
    return isinstance(arg, ast.Name) and arg.id == name and all(b.kind == "param" for b in bound)


def _pos(node: ast.AST) -> tuple:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def rebound_trained(m: SemanticModel, stmt: ast.stmt, target: ast.AST) -> Optional[Rebound]:
    """The first binding of ``target`` (the wrapper's name, wrapped at ``stmt``) after the
    wrap, in the same function, to another value, with what then reads that value in a way
    the migration changes: a training loop that runs after it and reads the name (the loop
    itself, or the call after it of a function that runs the loop), else a use that the
    migration routes through the wrapper (``net.load_state_dict(...)``, ``net.fc``, the name
    passed on: anything but a forward or the ``nn.Module`` API the wrapper shares, such as
    ``net.cuda()`` or ``net.eval()``); ``None`` where there is none."""
    if not isinstance(target, ast.Name):
        return None
    bindings = m.bindings_of(target)
    func = m.enclosing_function(stmt)
    end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    reads = [n for n in m.nodes(ast.Name) if n.id == target.id and isinstance(n.ctx, ast.Load) and m.bindings_of(n) is bindings]
    if not reads:
        return None
    wraps_after = [c for c in m.calls(DP) if m.enclosing_function(c) is func and _pos(c) > end]
    loops = [lp for lp in training_loops(m) if any(m.contains(lp, n) for n in reads)]
    for b in bindings:
        if b.kind not in _BINDS:
            continue
        r = b.node if isinstance(b.node, ast.stmt) else m.statement_of(b.node)
        if r is None or _pos(r) <= end or m.enclosing_function(r) is not func or m.contains(r, stmt):
            continue
        if _keeps_value(m, r, target.id) or _handed_back(m, r, target.id) or any(m.contains(r, c) for c in m.calls(DP)):
            continue
        if any(m.contains(r, c) for c in m.calls(LOAD)):
            continue  # a whole object loaded in place of the wrapper: whole_saves refuses it (DDP138)
        if _makes_wrapper(m, r):
            continue
        if any(_pos(c) > _pos(r) for c in wraps_after):
            continue  # wrapped again: that wrap is migrated on its own
        found = _runs_after(m, r, func, loops)
        if found is not None:
            return Rebound(r, found, True)
        for n in reads:
            if _neutral(m, n) or (m.contains(r, n) and not _in_body(r, n, m)):
                continue
            if _runs_after(m, r, func, [n]) is not None:
                return Rebound(r, n, False)
    return None


def _makes_wrapper(m: SemanticModel, r: ast.stmt) -> bool:
    """``r`` calls something that wraps in DataParallel (a function of this script that
    reaches a wrap, or a project function that returns a wrapper): a wrapper again, migrated
    where it is made."""
    from dp2ddp.model.wrap_context import project_wrapper_returns

    wrapping = {id(c) for c, _ in project_wrapper_returns(m)}
    dp_funcs = {m.enclosing_function(c) for c in m.calls(DP)} - {None}
    for c in ast.walk(r):
        if not isinstance(c, ast.Call):
            continue
        if id(c) in wrapping:
            return True
        t = m.resolve_call(c)
        if t is not None and dp_funcs & m.reach(t):
            return True
    return False


def _in_body(r: ast.stmt, n: ast.AST, m: SemanticModel) -> bool:
    """``n`` runs after ``r`` binds: in the body of the ``for``/``with`` ``r``."""
    return isinstance(r, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)) and any(m.contains(s, n) for s in r.body)


def _neutral(m: SemanticModel, n: ast.AST, depth: int = 0) -> bool:
    """A read that means the same of a bare module as of a wrapper, and that the migration
    leaves as it is: a forward, the ``nn.Module`` API they share (not ``state_dict``, whose
    keys the migration routes), or an argument of a function of the script that makes only
    such reads of its parameter."""
    use = classify(m, n)
    if use.kind in ("forward", "api"):
        return True
    if use.kind != "passed" or use.function is None or depth >= 2:
        return False
    call = m.parent(n)
    params = [p for p in m.params(use.function) if m.argument_for(use.function, call, p) is n]
    if len(params) != 1:
        return False
    inner = [x for x in ast.walk(use.function) if isinstance(x, ast.Name) and x.id == params[0]
             and m.scope_of(x) is m.scopes.get(use.function)]
    if any(not isinstance(x.ctx, ast.Load) for x in inner):
        return False
    return all(_neutral(m, x, depth + 1) for x in inner)


def _runs_after(m: SemanticModel, r: ast.stmt, func: Optional[ast.AST], nodes: List[ast.AST]) -> Optional[ast.AST]:
    """A node of ``nodes`` that runs after ``r``: itself after ``r`` in ``func``, or in a
    function that a call after ``r`` in ``func`` reaches (that call, then)."""
    for n in nodes:
        if m.enclosing_function(n) is func and _pos(n) > _pos(r):
            return n
    holders = {m.enclosing_function(n) for n in nodes} - {None, func}
    if not holders:
        return None
    root = func if func is not None else m.tree
    for c in m.calls_in(root):
        if _pos(c) <= _pos(r):
            continue
        t = m.resolve_call(c)
        if t is not None and holders & m.reach(t):
            return c
    return None


class Replaced(NamedTuple):
    stmt: ast.stmt  # the assignment of a new layer into the wrapped model
    use: ast.AST  # the training that runs after it (a loop, or the call that runs one)


def replaced_after_wrap(m: SemanticModel, stmt: ast.stmt, target: ast.AST, module: Optional[ast.AST]) -> Optional[Replaced]:
    """A layer of the wrapped model replaced after the wrap and before training:
    ``net.module.fc = nn.Linear(640, n)`` (hendrycks' pre-training tune.py), ``net.fc = ...``,
    or the same through the wrapped module's own name, in the function of the wrap and after
    it, with a training loop that reads the wrapper's name running after it. DataParallel
    replicates the module on every forward and sees the new layer; DDP keeps synchronising
    the parameters it was built with, and the new ones train apart on every rank."""
    if not isinstance(target, ast.Name):
        return None
    names = {target.id}
    if isinstance(module, ast.Name):
        names.add(module.id)
    func = m.enclosing_function(stmt)
    end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    bindings = m.bindings_of(target)
    reads = [n for n in m.nodes(ast.Name) if n.id == target.id and isinstance(n.ctx, ast.Load) and m.bindings_of(n) is bindings]
    loops = [lp for lp in training_loops(m) if any(m.contains(lp, n) for n in reads)]
    if not loops:
        return None
    for s in m.nodes(ast.Assign):
        if _pos(s) <= end or m.enclosing_function(s) is not func or not _new_layer(m, s.value):
            continue
        if not any(isinstance(t, ast.Attribute) and isinstance(_root(t), ast.Name) and _root(t).id in names for t in s.targets):
            continue
        found = _runs_after(m, s, func, loops)
        if found is not None:
            return Replaced(s, found)
    return None


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


_NOT_LAYERS = ("torch.nn.functional.", "torch.nn.init.", "torch.nn.utils.")


def _new_layer(m: SemanticModel, value: ast.AST) -> bool:
    """``value`` makes a new layer or parameter: a call of ``torch.nn``'s (``nn.Linear(...)``,
    ``nn.Parameter(...)``) or of a Module class of this script."""
    from dp2ddp.model.kinds import is_module_class

    if not isinstance(value, ast.Call):
        return False
    if any(q.startswith("torch.nn.") and not q.startswith(_NOT_LAYERS) for q in m.qualified_names(value.func)):
        return True
    return isinstance(value.func, ast.Name) and is_module_class(m, m.classes.get(value.func.id))


class Regrown(NamedTuple):
    call: ast.Call  # ``self.G.module.grow_network()``: a method of the wrapped model's class, after the wrap
    change: ast.stmt  # what in that method changes the model's layers (``self.model = new_model``)
    where: str  # the file of that method, relative to the script's folder ("" for the script)


# methods that change which parameters a module holds, called on ``self`` in a method
_STRUCTURE_CALLS = frozenset({"add_module", "register_module", "register_parameter"})


def regrown_after_wrap(m: SemanticModel, wrapper: ast.AST, module: Optional[ast.AST]) -> Optional[Regrown]:
    """A method of the wrapped model's class that changes its layers, called through the
    wrapper after the wrap (``self.G.module.grow_network()`` in a progressive GAN's training
    step: it builds a new ``self.model`` with more layers). DataParallel replicates the module
    on every forward and sees the new layers; DistributedDataParallel keeps synchronising the
    parameters it was built with, and the new ones train apart on every rank, silently.

    The class is the one the wrapped module is made from (a class of the script or of a
    project module, through names and ``self.x``: :func:`dp2ddp.model.flow.origins`); the
    calls are ``W.module.method(...)`` on a variable that holds the wrapper
    (:func:`dp2ddp.model.uses.wrapper_keys`); a method changes the layers where it deletes or
    rebinds an attribute of ``self`` that ``__init__`` set from a call (``self.model =
    new_model``, ``del self.model``), or calls ``self.add_module``/``register_module``/
    ``register_parameter``."""
    from dp2ddp.model.collectives import assigned_keys, var_key
    from dp2ddp.model.flow import origins
    from dp2ddp.model.project_defs import class_of_call, method_of
    from dp2ddp.model.uses import wrapper_keys

    if module is None:
        return None
    classes = []
    for node, _path in origins(m, module):
        got = class_of_call(m, node)
        if got is not None:
            classes.append(got)
    if not classes:
        return None
    seeds = assigned_keys(m, wrapper)  # the wrapper as assigned: ``DataParallel(g).to(device)`` whole
    keys = wrapper_keys(m, seeds) if seeds else set()
    if not keys:
        return None
    for call in m.nodes(ast.Call):
        f = call.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "module"
                and var_key(m, f.value.value) in keys):
            continue
        for pm, cls, rel in classes:
            method = method_of(pm, cls, f.attr, rel)
            change = _changes_layers(pm, cls, method[1]) if method is not None else None
            if change is not None:
                return Regrown(call, change, rel)
    return None


def _changes_layers(pm: SemanticModel, cls: ast.ClassDef, method: ast.AST) -> Optional[ast.stmt]:
    """The first statement of ``method`` that changes which layers ``self`` holds (see
    :func:`regrown_after_wrap`)."""
    from dp2ddp.model.project_defs import method_of

    got = method_of(pm, cls, "__init__")
    init = got[1] if got is not None else None
    made = set()  # attributes __init__ sets from a call: its layers (and other objects)
    for n in ast.walk(init) if init is not None else ():
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call):
            made.update(t.attr for t in n.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self")
    for n in ast.walk(method):
        if isinstance(n, ast.Delete) and any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                                             and t.attr in made for t in n.targets):
            return n
        if isinstance(n, ast.Assign) and not isinstance(n.value, ast.Constant) and any(
                isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr in made
                for t in n.targets):
            return n
        if (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
                and n.value.func.attr in _STRUCTURE_CALLS and isinstance(n.value.func.value, ast.Name)
                and n.value.func.value.id == "self"):
            return n
    return None
