"""Sub-modules a model's ``forward`` calls on some paths only.

``if self.num_layers == 3: x = self.layer2(x)`` (SimSiam's projector), or the conditional
expression ``x if self.equal_io else self.shortcut(x)`` (shake-shake): on the other path
``layer2``'s parameters get no gradient, and DistributedDataParallel, built without
``find_unused_parameters=True``, stops the next iteration ("Expected to have finished
reduction in the prior iteration"). DataParallel never minded. Tests that cannot leave a
module with parameters unused are not counted: ``if self.downsample is not None:``
(``None`` holds no parameters) and ``if self.training:`` (true in every training step)."""

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
