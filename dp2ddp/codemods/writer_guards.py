"""Which SummaryWriters (and writer-like objects: one a helper returns, a project class that
writes files) can be made on rank 0 alone: every use of the variables that hold them,
followed through ``self.``, returns and parameters, is a statement rank 0 alone can run, or a
test that allows ``None``. :func:`guarded_writers` computes the ``GuardedWriters`` fact that
:mod:`rank_writers` provides; :func:`is_writer_use` is what :mod:`rank_zero` guards."""

from __future__ import annotations

import ast
from typing import List, Optional, Set

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import GuardedWriters
from dp2ddp.model.collectives import VarKey, assigned_keys, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import SUMMARY_WRITERS
from dp2ddp.model.ranks import rank_guarded
from dp2ddp.model.uses import wrapper_keys
from dp2ddp.model.writers import Writer, writers
from dp2ddp.model.writing_classes import writing_class

def guarded_writers(m: SemanticModel, shared: frozenset = frozenset(), early=None) -> GuardedWriters:
    """Variables holding a SummaryWriter (or a writer-like object) whose every use can be
    guarded. The writers are followed together: a function called once with each of two
    writers (``train(logger=train_logger)``, ``train(logger=val_logger)``) holds one of them.
    ``shared``: ``self.`` attributes that classes in other modules read (a project's
    ``BaseTrainer`` whose ``Trainer`` subclass writes through ``self.writer``): a writer kept
    in one has uses this migration cannot see or guard, so it cannot be ``None`` elsewhere.
    ``early(node)``: the node runs before the process group exists, where rank_zero guards
    nothing (pt.darts' module-level ``writer.add_text(...)``)."""
    bad: List = []
    made: List = []
    creations = []
    for w in writers(m):
        if w.kind != "tensorboard":
            continue
        keys = assigned_keys(m, w.call)
        if not keys:
            bad.append((w, "its value is not kept in a variable"))
            continue
        creations.append((w, keys))
    seen_calls = {id(w.call) for w, _ in creations}
    helper_made = []
    for key, creation in _writer_like(m).items():
        if id(creation) not in seen_calls:
            creations.append((Writer("tensorboard", creation), [key]))
            helper_made.append(creation)
    for key, made_here in _file_loggers(m).items():
        for creation in made_here:
            if id(creation) not in seen_calls:
                creations.append((Writer("tensorboard", creation), [key]))
                helper_made.append(creation)
    seeds: Set[VarKey] = set()
    for _, keys in creations:
        seeds.update(keys)
    got = wrapper_keys(m, seeds) if seeds else set()
    problem = _unguardable_use(m, got, early) if got else None
    outside = sorted(k[2] for k in got if k[0] == "attr" and k[2][5:] in shared)
    if problem is None and outside:
        problem = f"`{outside[0]}` is also used by a subclass in another module, whose uses dp2ddp cannot guard"
    if problem is not None:
        for w, _ in creations:
            if all(w.call is not h for h in helper_made) or outside:
                bad.append((w, problem))
        got = set()
    else:
        made.extend(helper_made)
    return GuardedWriters(got, made, bad)


TB_METHODS = frozenset({
    "add_scalar", "add_scalars", "add_image", "add_images", "add_figure", "add_histogram", "add_text", "add_graph",
    "add_pr_curve", "add_embedding", "add_hparams", "add_video", "add_audio", "add_mesh", "add_image_with_boxes",
    "flush", "close",
})


def _writer_like(m: SemanticModel):
    """Variables that behave like a TensorBoard writer although its class is not visible
    (``self.writer = self.summary.create_summary()`` from a helper module): assigned once
    from a call, and only ever used through ``add_scalar``-like methods (one ``add_*`` at
    least). var key -> the call that creates it."""
    uses: dict = {}
    for call in m.nodes(ast.Call):
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr in TB_METHODS:
            k = var_key(m, f.value)
            if k is not None:
                uses.setdefault(k, set()).add(f.attr)
    out = {}
    for key, methods in uses.items():
        if not any(x.startswith("add_") for x in methods):
            continue
        creations = [
            a.value for a in m.nodes(ast.Assign)
            if len(a.targets) == 1 and var_key(m, a.targets[0]) == key and isinstance(a.value, ast.Call)
        ]
        if len(creations) == 1 and not m.qualified_names(creations[0].func) & SUMMARY_WRITERS:
            out[key] = creations[0]
    return out


def _file_loggers(m: SemanticModel) -> dict:
    """Variables holding an object of a class that writes files (``logger_test =
    Logger(path, title=title)``, :func:`dp2ddp.model.writing_classes.writing_class`), every
    assignment of which makes one and every use of which rank 0 alone can run (method calls
    as statements): made on rank 0 only, like a SummaryWriter. var key -> its creations.
    One used as a value stays on every rank, as before."""
    found: dict = {}
    for a in m.nodes(ast.Assign):
        if len(a.targets) == 1 and isinstance(a.value, ast.Call) and writing_class(m, a.value) is not None:
            key = var_key(m, a.targets[0])
            if key is not None:
                found.setdefault(key, []).append(a.value)
    out = {}
    for key, made in found.items():
        every = [a for a in m.nodes(ast.Assign) if len(a.targets) == 1 and var_key(m, a.targets[0]) == key]
        if len(every) != len(made) or any(rank_guarded(m, c) for c in made):
            continue
        if _unguardable_use(m, wrapper_keys(m, {key})) is None:
            out[key] = made
    return out


def is_writer_use(ctx: Context, stmt: ast.stmt) -> bool:
    """``writer.add_scalar(...)`` as a statement, for a guarded SummaryWriter."""
    keys = ctx.need(GuardedWriters).keys
    if not keys or not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    call = stmt.value
    f = call.func
    if isinstance(f, ast.Attribute) and var_key(ctx.m, f.value) in keys:
        return True
    # summary.visualize_image(writer, ...): an outside helper that writes with it
    return ctx.m.resolve_call(call) is None and any(var_key(ctx.m, a) in keys for a in call.args)


def _followed(m: SemanticModel, call: ast.Call, node: ast.AST, keys: Set[VarKey]) -> bool:
    """``node`` is passed to a function of the script whose parameter wrapper_keys follows
    (every call of it passes the writer); a parameter some other call fills with another
    value is not followed, and the use stays unguardable."""
    func = m.resolve_call(call)
    if func is None:
        return False
    return any(("local", func, p) in keys for p in m.params(func) if m.argument_for(func, call, p) is node)


def _unguardable_use(m: SemanticModel, keys: Set[VarKey], early=None) -> Optional[str]:
    names = {k[2] for k in keys if k[0] != "attr"} | {k[2][5:] for k in keys if k[0] == "attr"}
    for node in m.nodes(ast.Name, ast.Attribute):
        ident = node.id if isinstance(node, ast.Name) else node.attr
        if ident not in names or not isinstance(node.ctx, ast.Load):
            continue
        if isinstance(node, ast.Attribute) and not isinstance(node.value, ast.Name):
            continue
        if var_key(m, node) not in keys:
            continue
        if early is not None and early(node) and not rank_guarded(m, node):
            return f"line {node.lineno} uses it before the process group is set up, where no rank test is added"
        parent = m.parent(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            call = m.parent(parent)
            if isinstance(call, ast.Call) and call.func is parent and isinstance(m.parent(call), ast.Expr):
                continue  # writer.add_scalar(...) as a statement
        if isinstance(parent, ast.Call) and node in parent.args and _followed(m, parent, node, keys):
            continue  # passed to a function of the script: followed by wrapper_keys
        if isinstance(parent, ast.keyword) and isinstance(m.parent(parent), ast.Call) and _followed(m, m.parent(parent), node, keys):
            continue  # f(logger=writer): likewise
        if isinstance(parent, ast.Call) and node in parent.args and isinstance(m.parent(parent), ast.Expr):
            continue  # passed to another module's function as a statement: the statement is guarded
        if (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Name)
            and parent.func.id == "getattr"
            and len(parent.args) == 3
            and parent.args[0] is node
        ):
            continue  # getattr(writer, name, None): a script that already allows no writer
        ret = parent if isinstance(parent, ast.Return) else m.parent(parent) if isinstance(parent, ast.Tuple) else None
        if isinstance(ret, ast.Return) and isinstance(node, ast.Name):
            func = m.enclosing_function(node)
            if func is not None and m.call_sites(func) and all(isinstance(m.parent(c), ast.Assign) for c in m.call_sites(func)):
                continue  # returned to callers that keep it (followed by wrapper_keys)
        if isinstance(parent, (ast.Compare, ast.If, ast.BoolOp, ast.UnaryOp)) or (
            isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in ("isinstance", "bool")
        ):
            continue  # `if writer is not None:`: a test, fine with None
        return f"line {node.lineno} uses it as a value ({m.source(parent)[:40]})"
    return None
