"""Objects a script keeps for output only: a project ``Logger`` made once, whose methods the
script only calls as statements (``logger.update_scalers(data_dict)``), which keep their
state on the object, return nothing, train nothing and reach no collective.

Such a method may keep state (a step counter, a plotter's history) and still run on rank 0
alone: nothing outside the object reads that state, so the other ranks, which skip the
call, lose nothing they use. What it changes in an argument (``ordered_dict[key] =
value.item()``) is the caller's, so the script must not read that argument after the call
(the dict is made anew each pass before it is read: :func:`_dropped_after`).
:func:`output_only_call` says whether a call of a project method is such a call; the writers
fact (:func:`dp2ddp.model.companion_writes.companion_writes`) then lets it run on rank 0 alone.
"""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS

# methods that change the object they are called on
MUTATING = frozenset({"append", "extend", "update", "pop", "insert", "clear", "setdefault", "remove", "add",
                       "discard", "sort", "reverse", "popitem", "__setitem__"})
# calls that read an argument without changing it
_READING = frozenset({"isinstance", "len", "str", "repr", "print", "format", "float", "int", "sorted", "list", "tuple",
                      "dict", "enumerate", "zip", "getattr", "hasattr"})
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def trains_in(pm: SemanticModel, func: ast.AST) -> Optional[int]:
    """The line where ``func`` (of module ``pm``) trains: its first training loop, or else
    its first ``.backward()`` call; ``None`` where it does not."""
    from dp2ddp.model.steps import backward_calls
    from dp2ddp.model.training import training_loops

    loop = next((lp for lp in training_loops(pm) if pm.contains(func, lp)), None)
    if loop is not None:
        return loop.lineno
    back = next((c for c in backward_calls(pm) if pm.contains(func, c)), None)
    return back.lineno if back is not None else None


def every_rank_runs(pm: SemanticModel, func: ast.AST) -> bool:
    """``func`` (of module ``pm``) reaches a collective (a DataParallel or DDP forward too)
    or trains (its backward passes are collectives under DDP): every rank must run it."""
    from dp2ddp.model.collectives import reaching_functions

    return func in reaching_functions(pm) or func in reaching_functions(pm, dp=True) or trains_in(pm, func) is not None


def keeps_to_itself(pm: SemanticModel, func: ast.AST) -> bool:
    """``func`` (a method of module ``pm``) returns nothing, binds no global, yields
    nothing, and no rank but one can skip it (:func:`every_rank_runs`): whatever it changes
    is its object's (or an argument's: :func:`changed_params`)."""
    if every_rank_runs(pm, func):
        return False
    for n in ast.walk(func):
        if isinstance(n, ast.Return) and n.value is not None and not (isinstance(n.value, ast.Constant) and n.value.value is None):
            return False
        if isinstance(n, (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom)):
            return False
    return True


def changed_params(pm: SemanticModel, func: ast.AST, depth: int = 0) -> set:
    """The parameters (not ``self``) ``func`` may change: stored into (``d[k] = v``), called
    with a mutating method, or handed to code of the project that may change them (a method
    of its own object, ``self.plotter.update(d)``; a function of its module that changes the
    parameter it binds them to, followed three calls deep: ``get_output_path(args, ...)``
    only reads ``args``); a library call (``torch.save(state, path)``, ``json.dump(d, f)``)
    changes nothing it is given."""
    params = set(pm.params(func)) - {"self"}
    out: set = set()
    for n in ast.walk(func):
        if isinstance(n, (ast.Assign, ast.AugAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                base = t.value if isinstance(t, (ast.Subscript, ast.Attribute)) else None
                if isinstance(base, ast.Name) and base.id in params:
                    out.add(base.id)
        elif isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in params and f.attr in MUTATING:
                out.add(f.value.id)
            target = pm.resolve_call(n)
            ours = target is not None or (isinstance(f, ast.Attribute) and _on_self(f.value))
            if ours and not (isinstance(f, ast.Name) and f.id in _READING):
                handed = {a.id for a in list(n.args) + [k.value for k in n.keywords] if isinstance(a, ast.Name) and a.id in params}
                if handed and _plain_function(pm, target) and depth < 3:
                    changes = changed_params(pm, target, depth + 1)  # what the function changes, by its signature
                    handed = {name for name in handed if any(
                        isinstance(arg, ast.Name) and arg.id == name for q in changes
                        for arg in [pm.argument_for(target, n, q)]) or _unbound(pm, target, n, name)}
                out.update(handed)
    return out


def _plain_function(pm: SemanticModel, target: Optional[ast.AST]) -> bool:
    """A top-level function of the module with no ``*args``/``**kwargs``: every argument of
    a call binds to a parameter :meth:`argument_for` can name."""
    return (isinstance(target, FUNCTIONS) and pm.enclosing_class(target) is None
            and target.args.vararg is None and target.args.kwarg is None)  # type: ignore[union-attr]


def _unbound(pm: SemanticModel, target: ast.AST, call: ast.Call, name: str) -> bool:
    """``name`` is passed in ``call`` where no parameter of ``target`` can be told to bind it."""
    params = [p.arg for p in target.args.posonlyargs + target.args.args + target.args.kwonlyargs]  # type: ignore[attr-defined]
    bound = [pm.argument_for(target, call, q) for q in params]
    passed = [a for a in list(call.args) + [k.value for k in call.keywords] if isinstance(a, ast.Name) and a.id == name]
    return any(not any(b is a for b in bound) for a in passed)


def _on_self(e: ast.AST) -> bool:
    while isinstance(e, (ast.Attribute, ast.Subscript)):
        e = e.value
    return isinstance(e, ast.Name) and e.id == "self"


def _pos(node: ast.AST) -> tuple:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def _dropped_after(m: SemanticModel, name: ast.Name, stmt: ast.stmt) -> bool:
    """The value ``name`` holds at ``stmt`` is not read after it: no read of the name later in
    its function, and, in a loop, every read earlier in the loop's pass comes after a
    binding of the name in that pass (``data_dict = model(x)`` ... ``logger.log(data_dict)``)."""
    func = m.enclosing_function(stmt)
    bindings = m.bindings_of(name)
    if not bindings:
        return False
    reads = [n for n in m.nodes(ast.Name) if n.id == name.id and isinstance(n.ctx, ast.Load)
             and m.bindings_of(n) is bindings and m.enclosing_function(n) is func and n is not name]
    end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    if any(_pos(r) > end for r in reads):
        return False
    loop = next((a for a in m.ancestors(stmt) if isinstance(a, _LOOPS)), None)
    if loop is None or (func is not None and not m.contains(func, loop)):
        return True
    if not all(m.contains(loop, b.node) for b in bindings):
        return False  # bound outside the loop: the next pass reads what this call left
    top = [b for b in bindings if b.kind == "assign" and any(b.node is s or m.contains(s, b.node) and isinstance(s, ast.Assign)
                                                             for s in getattr(loop, "body", []))]
    first = min((_pos(b.node) for b in top), default=None)
    return first is not None and all(_pos(r) > first for r in reads if m.contains(loop, r))


def output_only_call(m: SemanticModel, call: ast.Call, pm: SemanticModel, func: ast.AST) -> bool:
    """``logger.update_scalers(data_dict)``: ``func`` (run by ``call``) is a method of a
    project class, and the receiver a name the script binds only to objects of that class
    and uses only to call its methods as statements, each of which keeps its changes to
    itself (:func:`keeps_to_itself`); the arguments those methods may change are names the
    script does not read after the call."""
    from dp2ddp.model.project_defs import method_of, project_def

    f = call.func
    cls = pm.enclosing_class(func)
    if cls is None or not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)):
        return False
    bindings = m.bindings_of(f.value)
    if not bindings or not all(b.kind == "assign" and isinstance(b.value, ast.Call) for b in bindings):
        return False
    for b in bindings:
        found = project_def(m, b.value.func) if isinstance(b.value.func, (ast.Name, ast.Attribute)) else None
        if found is None or found[1] is not cls:
            return False
    for n in m.nodes(ast.Name):
        if n.id != f.value.id or not isinstance(n.ctx, ast.Load) or m.bindings_of(n) is not bindings:
            continue
        attr, use = m.parent(n), m.parent(m.parent(n))
        if not (isinstance(attr, ast.Attribute) and isinstance(use, ast.Call) and use.func is attr
                and isinstance(m.parent(use), ast.Expr)):
            return False  # read, handed on, or a result used: the object is more than output
        got = method_of(pm, cls, attr.attr)  # its own, or a base class's (of another module too)
        if got is None or not isinstance(got[1], FUNCTIONS) or not keeps_to_itself(got[0], got[1]):
            return False
        mpm, method = got[0], got[1]
        changed = changed_params(mpm, method)
        for p in changed:
            arg = mpm.argument_for(method, use, p)
            if arg is None:
                continue
            if not isinstance(arg, ast.Name) or not _dropped_after(m, arg, m.parent(use)):  # type: ignore[arg-type]
                return False
    return True
