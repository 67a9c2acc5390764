"""Sub-modules a model's ``forward`` calls on some paths only, or on none.

``if self.num_layers == 3: x = self.layer2(x)`` (SimSiam's projector), or the conditional
expression ``x if self.equal_io else self.shortcut(x)`` (shake-shake): on the other path
``layer2``'s parameters get no gradient, and DistributedDataParallel, built without
``find_unused_parameters=True``, stops the next iteration ("Expected to have finished
reduction in the prior iteration"). DataParallel never minded. Tests that cannot leave a
module with parameters unused are not counted: ``if self.downsample is not None:``
(``None`` holds no parameters) and ``if self.training:`` (true in every training step).
:func:`unused_submodules`: those it never calls, or runs only parts of (open-reid's walk over a
torchvision resnet's children that stops before ``fc``)."""

from __future__ import annotations

import ast
from typing import List, Set, Tuple

from dp2ddp.model.core import SemanticModel


def conditional_submodules(m: SemanticModel) -> List[Tuple[ast.ClassDef, ast.Call, str]]:
    """(class, the call, the attribute) for each ``self.<attr>(...)`` of a module class's
    ``forward`` that one branch of an ``if`` calls and another does not."""
    from dp2ddp.model.kinds import is_module_class

    out = []
    for cls in m.nodes(ast.ClassDef):
        if not is_module_class(m, cls):
            continue
        forward = m.methods(cls).get("forward")
        if forward is None:
            continue
        held = {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        for node in ast.walk(forward):
            if isinstance(node, ast.If):
                body, orelse = node.body, node.orelse
            elif isinstance(node, ast.IfExp):
                # ``skip = x if self.equal_io else self.shortcut(x)`` (shake-shake's blocks)
                body, orelse = [node.body], [node.orelse]
            else:
                continue
            if _harmless_test(node.test):
                continue
            here, there = _calls(body), _calls(orelse)
            for attr in sorted(set(here) ^ set(there)):
                if attr not in held or attr in _tested(node.test):
                    continue  # a method, or a module the test checks is there
                if _built_only_where_called(m, cls, node.test, attr, attr in here):
                    continue  # each instance builds it exactly where its forward calls it
                out.append((cls, (here.get(attr) or there.get(attr)), attr))
    return out


def _built_only_where_called(m: SemanticModel, cls: ast.ClassDef, test: ast.AST, attr: str, when: bool) -> bool:
    """``__init__`` builds ``self.<attr>`` under the same test as ``forward`` calls it on, on
    the same branch (``when``: the test's true branch), and sets it to ``None`` (or leaves it
    unset) on the other, the test reading only attributes of ``self`` that only ``__init__``
    assigns (KD-Zoo's ``self.downsample = in_channels != out_channels``, then ``if
    self.downsample: self.ds = ...`` in both): each instance takes the same branch in every
    forward, and has the sub-module exactly where it calls it, so no parameter goes unused."""
    init = m.methods(cls).get("__init__")
    tested = _tested(test)
    if init is None or not tested:
        return False
    if any(isinstance(n, ast.Name) and n.id != "self" for n in ast.walk(test)):
        return False  # a global or a parameter decides: not shown to be the same in both
    for name, fn in m.methods(cls).items():
        if name == "__init__":
            continue
        for n in ast.walk(fn):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
            if any(isinstance(t, ast.Attribute) and t.attr in tested | {attr} for t in targets):
                return False  # the switch or the sub-module changes after __init__
    same = [n for n in ast.walk(init) if isinstance(n, ast.If) and ast.dump(n.test) == ast.dump(test)]
    if len(same) != 1:
        return False
    branch, other = (same[0].body, same[0].orelse) if when else (same[0].orelse, same[0].body)

    def assigns(stmts, none: bool) -> bool:
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == attr for t in n.targets)
                   and (isinstance(n.value, ast.Constant) and n.value.value is None) == none
                   for s in stmts for n in ast.walk(s))

    outside = [n for n in ast.walk(init) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Attribute) and t.attr == attr for t in n.targets)
               and not m.contains(same[0], n)]
    return assigns(branch, none=False) and not assigns(other, none=False) and not outside


def _calls(stmts: List[ast.AST]) -> dict:
    found = {}
    for s in stmts:
        for n in ast.walk(s):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                    and n.func.value.id == "self"):
                found.setdefault(n.func.attr, n)
    return found


def _tested(test: ast.AST) -> Set[str]:
    """The ``self.`` attributes a test reads (``if self.proj is not None:``, ``if self.proj:``)."""
    return {n.attr for n in ast.walk(test)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _harmless_test(test: ast.AST) -> bool:
    t = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else test
    return isinstance(t, ast.Attribute) and t.attr == "training" and isinstance(t.value, ast.Name) and t.value.id == "self"


# library models whose heads a forward often leaves out (open-reid walks a torchvision
# resnet's children and stops before ``fc``; a backbone called piece by piece)
_LIBRARY_MODELS = ("torchvision.models.", "timm.", "pretrainedmodels.", "torch.hub.load")
# what reads a module's parts generically: which parts the forward runs cannot be told
_GENERIC = frozenset({"_modules", "children", "named_children", "modules", "named_modules"})


def unused_submodules(m: SemanticModel) -> List[Tuple[ast.ClassDef, ast.AST, str, str]]:
    """``(class, node, attr, how)`` for each sub-module with parameters that a module class's
    ``__init__`` makes (``self.<attr> = nn.Linear(...)``, a torchvision or timm model, a
    module class of this module) and whose parameters its ``forward`` (with the methods of
    the class it calls) leaves out of some step: never read there (``how`` ``"never"``), or,
    for a library model, only some of its parts run (``self.base.layer1(x)``, a walk over
    ``self.base._modules`` that stops early: ``"partly"``). DistributedDataParallel built
    without ``find_unused_parameters=True`` stops the second step ("Expected to have
    finished reduction in the prior iteration"); DataParallel never minded. A class whose
    forward reads ``self`` as a whole (``self.children()``, ``getattr(self, name)``, ``self``
    handed to a function) is not judged."""
    from dp2ddp.model.kinds import is_module_class, without_parameters

    out = []
    for cls in m.nodes(ast.ClassDef):
        if not is_module_class(m, cls):
            continue
        methods = m.methods(cls)
        init, forward = methods.get("__init__"), methods.get("forward")
        if init is None or forward is None:
            continue
        held = {}
        for n in ast.walk(init):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call):
                t = n.targets[0]
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    kind = _module_kind(m, n.value) or "unknown"  # (open-reid: ``ResNet.__factory[depth](...)``)
                    if not without_parameters(m, n.value):
                        held.setdefault(t.attr, (n, kind))
        if not held:
            continue
        reads = _self_reads(m, _forward_methods(methods, forward))
        if reads is None:
            continue  # ``self`` read as a whole: which parts run cannot be told
        for attr, (assign, kind) in sorted(held.items()):
            if _stored_again(cls, attr):
                continue
            uses = reads.get(attr, [])
            if not uses and kind != "unknown":
                out.append((cls, assign, attr, "never"))
            elif (kind == "library" and all(_partial(m, u) for u in uses)) or any(_walk_stops(m, u) for u in uses):
                out.append((cls, uses[0], attr, "partly"))
    return out


def _module_kind(m: SemanticModel, call: ast.Call, depth: int = 0):
    """``"torch"`` for a ``torch.nn`` module, ``"library"`` for a torchvision/timm/... model,
    ``"own"`` for a module class of this module; ``None`` for anything else."""
    from dp2ddp.model.kinds import is_module_class

    names = m.qualified_names(call.func)
    if any(q.startswith("torch.nn.") and not q.startswith("torch.nn.functional") for q in names):
        container = any(q.rsplit(".", 1)[1] in ("Sequential", "ModuleList", "ModuleDict") for q in names)
        return None if container and not call.args and not call.keywords else "torch"  # (``nn.Sequential()``: empty)
    if any(q.startswith(_LIBRARY_MODELS) for q in names):
        return "library"
    target = m.resolve_call(call)
    if isinstance(target, ast.ClassDef) and is_module_class(m, target):
        return "own"
    if target is not None and depth < 3:  # a builder function of this module: what it returns
        from dp2ddp.model.flow import origins

        kinds = {_module_kind(m, n, depth + 1) if isinstance(n, ast.Call) and not p else None for n, p in origins(m, call)}
        if len(kinds) == 1 and None not in kinds:
            return kinds.pop()
    return None


def _forward_methods(methods: dict, forward: ast.AST) -> List[ast.AST]:
    """``forward`` and the methods of the class it calls (``self.features(x)``), transitively."""
    run, todo = [], [forward]
    while todo:
        fn = todo.pop()
        if any(fn is r for r in run):
            continue
        run.append(fn)
        for n in ast.walk(fn):
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                    and n.attr in methods and n.attr != "__init__"):
                todo.append(methods[n.attr])
    return run


def _self_reads(m: SemanticModel, run: List[ast.AST]):
    """attr -> the ``self.<attr>`` reads in ``run``; ``None`` where ``self`` is read as a whole."""
    reads: dict = {}
    for fn in run:
        for n in ast.walk(fn):
            if not (isinstance(n, ast.Name) and n.id == "self"):
                continue
            up = m.parent(n)
            if not isinstance(up, ast.Attribute) or up.attr in _GENERIC or up.attr in ("__dict__", "_parameters"):
                return None  # ``helper(self)``, ``getattr(self, name)``, ``self.children()``
            if isinstance(up.ctx, ast.Load):
                reads.setdefault(up.attr, []).append(up)
    return reads


def _partial(m: SemanticModel, use: ast.Attribute) -> bool:
    """``self.base.layer1`` (a part of it), or ``self.base._modules``/``.children()`` walked
    (which may stop early): not the model run whole."""
    up = m.parent(use)
    return isinstance(up, ast.Attribute) and up.attr not in ("forward", "__call__") and up.attr not in (
        "parameters", "named_parameters", "state_dict")


def _walk_stops(m: SemanticModel, use: ast.Attribute) -> bool:
    """``for name, module in self.base._modules.items(): if name == 'avgpool': break``: a
    loop over the parts of a sub-module that may leave before the last one."""
    up = m.parent(use)
    if not (isinstance(up, ast.Attribute) and up.attr in _GENERIC):
        return False
    loop = next((a for a in m.ancestors(use) if isinstance(a, (ast.For, ast.comprehension))), None)
    if not isinstance(loop, ast.For) or not m.contains(loop.iter, use):
        return False
    return any(isinstance(n, (ast.Break, ast.Return)) for st in loop.body for n in ast.walk(st))


def _stored_again(cls: ast.ClassDef, attr: str) -> bool:
    """``self.<attr>`` is assigned more than once in the class (replaced, deleted): not judged."""
    count = sum(1 for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Delete))
                for t in (n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target])
                if isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self")
    return count > 1
