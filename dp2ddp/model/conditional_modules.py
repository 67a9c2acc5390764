"""Sub-modules a model's ``forward`` calls on some paths only.

``if self.num_layers == 3: x = self.layer2(x)`` (SimSiam's projector): on the other path
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
            if not isinstance(node, ast.If) or _harmless_test(node.test):
                continue
            here, there = _calls(node.body), _calls(node.orelse)
            for attr in sorted(set(here) ^ set(there)):
                if attr not in held or attr in _tested(node.test):
                    continue  # a method, or a module the test checks is there
                out.append((cls, (here.get(attr) or there.get(attr)), attr))
    return out


def _calls(stmts: List[ast.stmt]) -> dict:
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
