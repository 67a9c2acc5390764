"""Whether the DDP wrap needs ``find_unused_parameters=True``: a script that changes
``requires_grad`` after the wrap — of the wrapped model's parameters, not of an EMA copy,
a teacher or an input tensor — gets it (DDP125, :func:`needs_find_unused`;
:func:`owners_need_find_unused` for the functional form). One that unfreezes parameters
frozen when the wrapper is built gets a wrapper built over every parameter (DDP112,
:data:`dp2ddp.codemods.context.EVERY_PARAMETER`): DDP only averages the gradients of the
parameters that required grad when it was built, so the frozen ones are unfrozen for the
construction and frozen again right after; with ``find_unused_parameters=True`` they are
skipped while frozen and averaged once unfrozen, as the original trains them."""

from __future__ import annotations

import ast
import os
from typing import List, Optional, Union

from dp2ddp.codemods.context import EVERY_PARAMETER, FROZEN_AT_WRAP, Context
from dp2ddp.engine import Finding
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.kinds import is_tensor
from dp2ddp.model.uses import (changed_owner, from_pretrained_model, requires_grad_changes, sets_true,
                              transformers_model_in_project, unfrozen_in_project, unread_model_class)
from dp2ddp.model.wraps import Wrap


def needs_find_unused(ctx: Context, wraps: List[Wrap], out: List[Finding]) -> Union[bool, str]:
    """Whether the wraps need ``find_unused_parameters=True``: ``requires_grad`` changes
    after the wrap, or training passes over a list of settings (a model set up per item);
    :data:`EVERY_PARAMETER` where parameters frozen when the wrapper is built are unfrozen
    later (the wrapper must register them too)."""
    if not wraps:
        return False
    got = _requires_grad_needs(ctx, wraps, out)
    if got:
        return got
    library = _transformers_model(ctx, wraps)
    if library is not None:
        out.append(ctx.note(wraps[0].call, "DDP125", (
            f"the model is a transformers model ({library}), whose forward dp2ddp does not read and which may leave "
            "parameters unused in a step (XLNet's mask_emb): DistributedDataParallel(..., find_unused_parameters=True), "
            "as transformers' own Trainer builds it, or a step fails with \"Expected to have finished reduction in the "
            "prior iteration\"")))
        return True
    branch = _branch_only_submodule(ctx.m)
    if branch is not None:
        out.append(ctx.note(wraps[0].call, "DDP125", f"{branch}; "
                            "DistributedDataParallel(..., find_unused_parameters=True), or the next iteration fails "
                            "with \"Expected to have finished reduction in the prior iteration\""))
        return True
    return _settings_need(ctx, out)


def _transformers_model(ctx: Context, wraps: List[Wrap]) -> Optional[str]:
    """The transformers model class the wraps hold, where one does: a module made by
    ``.from_pretrained(...)`` in a script that (or whose project modules) imports such a
    class; in a project migration's helper, a wrap of what its callers hand it, where the
    project imports one (:attr:`dp2ddp.migrate.Options.transformers_model`)."""
    m = ctx.m
    if ctx.role == "helper":
        handed = getattr(ctx.options, "transformers_model", None)
        if handed and any(_is_param(m, w.module) for w in wraps):
            return handed
    if not any(from_pretrained_model(m, w.module) for w in wraps):
        return None
    return transformers_model_in_project(m)


def _is_param(m: SemanticModel, module: Optional[ast.AST]) -> bool:
    """``model`` of ``def model_device(n_gpu, model): ... model = DataParallel(model)``: a
    parameter of the function, its other bindings made from the name itself
    (``model = model.to(device)``, the wrap)."""
    if not isinstance(module, ast.Name):
        return False
    bindings = m.bindings_of(module)
    return any(b.kind == "param" for b in bindings) and all(
        b.kind == "param" or (b.value is not None and any(isinstance(n, ast.Name) and n.id == module.id for n in ast.walk(b.value)))
        for b in bindings)


def _settings_need(ctx: Context, out: List[Finding]) -> bool:
    """A training loop over a list of settings (``for width in widths:`` around a forward
    and backward pass, :func:`dp2ddp.model.settings_loops.settings_loops`) may set the model up
    differently for each item, so a pass may leave parameters unused that another uses."""
    from dp2ddp.model.settings_loops import settings_loops

    loops = [s for s in settings_loops(ctx.m) if s.same]
    if not loops:
        return False
    s = loops[0]
    out.append(ctx.note(s.loop, "DDP125", (
        f"the training passes of the loop over `{' '.join(ctx.m.source(s.value).split())}` may each leave parameters unused (a model set up "
        "per item): DistributedDataParallel(..., find_unused_parameters=True), or the next pass fails with "
        "\"Expected to have finished reduction in the prior iteration\"")))
    return True


def _requires_grad_needs(ctx: Context, wraps: List[Wrap], out: List[Finding]) -> Union[bool, str]:
    m = ctx.m
    changes = [c for c in requires_grad_changes(m) if not _other_model(m, c, wraps) and not _runs_the_wrap(m, c, wraps)]
    if not changes:
        where = unfrozen_in_project(m)
        unread = None if where is not None else next(
            (u for u in (unread_model_class(m, w.module) for w in wraps) if u is not None), None)
        if where is None and unread is None:
            return False
        why = (f"the project's model code unfreezes parameters during training ({where}: `requires_grad = True` over "
               "`.parameters()` outside `__init__`)" if where is not None else
               f"the model is made by {unread}, a module dp2ddp cannot read, whose code may freeze parameters and unfreeze "
               "them during training")
        how = ("with find_unused_parameters=True" if where is not None else
               "and where some are frozen when it is built, with find_unused_parameters=True (decided when it runs)")
        out.append(ctx.note(wraps[0].call, "DDP112", f"{why}: the DistributedDataParallel wrapper is built over every "
                            f"parameter (the frozen ones unfrozen while it is built, then frozen again), {how}, so their "
                            "gradients are averaged once they train"))
        return EVERY_PARAMETER if where is not None else FROZEN_AT_WRAP
    after = []
    before_false = []
    for c in changes:
        if any(_runs_before_wrap(m, c, w) for w in wraps):
            if sets_true(m, c) is not True:
                before_false.append(c)
        else:
            after.append(c)
    if not after:
        return False
    if before_false and any(sets_true(m, c) is True for c in after):
        c = next(c for c in after if sets_true(m, c) is True)
        out.append(
            ctx.note(
                c,
                "DDP112",
                f"parameters frozen before the wrap (line {before_false[0].lineno}) are unfrozen here: the "
                "DistributedDataParallel wrapper is built over every parameter (the frozen ones unfrozen while it is "
                "built, then frozen again), with find_unused_parameters=True, so their gradients are averaged once "
                "they train",
            )
        )
        return EVERY_PARAMETER
    out.append(_find_unused_note(ctx, after[0]))
    return True


def owners_need_find_unused(ctx: Context, out: List[Finding]) -> bool:
    """Functional wraps: any ``requires_grad`` change in the script needs
    ``find_unused_parameters=True`` (the wrapper is built where the model is created)."""
    changes = requires_grad_changes(ctx.m)
    if not changes:
        return False
    out.append(_find_unused_note(ctx, changes[0]))
    return True


def _branch_only_submodule(m: SemanticModel) -> Optional[str]:
    """A module class of the script or of the project modules it imports whose ``forward``
    calls a sub-module on one branch only (:func:`dp2ddp.model.conditional_modules.conditional_submodules`):
    where, for the note. Every class counts, whether or not the wrapped model holds it: at
    worst DDP looks for unused parameters it does not have (slower, never wrong)."""
    from dp2ddp.model.conditional_modules import conditional_submodules, unused_submodules
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.project import project_modules

    models = [(m, os.path.basename(m.path))]
    if m.path not in ("<string>", "<stdin>", "-") and os.path.exists(m.path):
        for real, (rel, _) in sorted(project_modules(m.path, m.tree).items()):
            pm = file_model(real)
            if pm is not None:
                models.append((pm, rel))
    for pm, rel in models:
        found = conditional_submodules(pm)
        if found:
            cls, call, attr = found[0]
            return f"{cls.name}.forward calls self.{attr} on one branch only ({rel}:{call.lineno}): on the other path its parameters get no gradient"
    for pm, rel in models:
        unused = unused_submodules(pm)
        if unused:
            cls, node, attr, how = unused[0]
            if how == "never":
                return f"{cls.name}.forward never runs self.{attr} ({rel}:{node.lineno}): its parameters get no gradient"
            return (f"{cls.name}.forward runs only parts of self.{attr} ({rel}:{node.lineno}): the parameters of the parts it "
                    "leaves out get no gradient")
    return None


def _other_model(m: SemanticModel, change: ast.AST, wraps: List[Wrap], depth: int = 0) -> bool:
    """The change touches a model made apart from every wrapped one (an EMA copy,
    ``copy.deepcopy(model)``, a teacher) or a tensor (an attack's ``delta``): it does not
    concern the wrapper's parameters. A call of a function of the script that changes
    ``requires_grad`` is judged by the changes inside it."""
    from dp2ddp.model.flow import origins

    target = m.resolve_call(change) if isinstance(change, ast.Call) and not (
        isinstance(change.func, ast.Attribute) and change.func.attr == "requires_grad_") else None
    if target is not None:
        inner = [c for c in requires_grad_changes(m) if c is not change and m.enclosing_function(c) is target]
        return depth < 4 and bool(inner) and all(_other_model(m, c, wraps, depth + 1) for c in inner)
    owner = changed_owner(m, change)
    if owner is None and isinstance(change, ast.Call) and isinstance(change.func, ast.Attribute) and change.func.attr == "requires_grad_":
        owner = change.func.value  # ``x.clone().requires_grad_()``
    if owner is not None and is_tensor(m, owner):
        return True  # an input's gradient (an adversarial attack's ``delta``): no parameter changes
    while isinstance(owner, (ast.Attribute, ast.Subscript)) and not (
        isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"
    ):
        owner = owner.value  # model.module[0], model.backbone -> model
    if owner is None:
        return False
    found = origins(m, owner)
    mine = {id(n) for n, _ in found}
    if not mine or any(isinstance(n, ast.Name) and m.enclosing_function(n) is not None and n.id in m.params(m.enclosing_function(n)) for n, _ in found):
        return False
    for n, _ in found:  # ``freeze(model.backbone)``: a part of what ``model`` holds
        root = n
        while isinstance(root, (ast.Attribute, ast.Subscript)) and not _root_is_self(root):
            root = root.value
        if root is not n:
            mine |= {id(x) for x, _ in origins(m, root)}
    wrapped = set()
    made = set()  # classes whose instances are wrapped
    for w in wraps:
        for e in (w.module, w.target):
            if e is not None:
                for n, _ in origins(m, e):
                    wrapped.add(id(n))
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                        made.add(n.func.id)
    cls = m.enclosing_class(change)
    if cls is not None and _root_is_self(owner) and {c.name for c in m.family(cls)} & made:
        return False  # Net.freeze_backbone(): self is the wrapped model
    return not (mine & wrapped)


def _runs_the_wrap(m: SemanticModel, change: ast.AST, wraps: List[Wrap]) -> bool:
    """``main()``: a call of the function that wraps (or of one that reaches it). Whether
    the changes it reaches run before or after the wrap is judged where they are, inside."""
    if not isinstance(change, ast.Call):
        return False
    target = m.resolve_call(change)
    if target is None:
        return False
    reached = set(map(id, m.reach(target)))
    return any(w.function is not None and id(w.function) in reached for w in wraps)


def _root_is_self(node: ast.AST) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _before_wrap(m: SemanticModel, node: ast.AST, w: Wrap) -> bool:
    """``node`` runs before the wrap: same function (or module level), earlier statement,
    not in a loop around the wrap."""
    return m.enclosing_function(node) is w.function and m.runs_before(node, w.stmt)


def _runs_before_wrap(m: SemanticModel, node: ast.AST, w: Wrap, depth: int = 0) -> bool:
    """``node`` runs only before the wrap: it does (:func:`_before_wrap`), or it is in a
    function of the script every call of which runs before the wrap (``self.unfreeze(True)``
    in the ``__init__`` of a model class made before the wrap)."""
    if _before_wrap(m, node, w):
        return True
    func = m.enclosing_function(node)
    if func is None or func is w.function or depth > 3:
        return False
    sites = m.call_sites(func)
    return bool(sites) and all(_runs_before_wrap(m, s, w, depth + 1) for s in sites)


def _find_unused_note(ctx: Context, change: ast.AST) -> Finding:
    return ctx.note(
        change,
        "DDP125",
        "requires_grad changes after the wrap: DistributedDataParallel(..., find_unused_parameters=True), or "
        "the next iteration fails with \"Expected to have finished reduction in the prior iteration\"",
    )
