"""Parameters an optimizer gets from a method of an object that holds a module.

A REINFORCE trainer hands its optimizer the critic's parameters through the baseline that
holds it::

    baseline = CriticBaseline(CriticNetwork(...))
    optimizer = Adam([{"params": model.parameters()},
                      {"params": baseline.get_learnable_parameters()}])

where ``get_learnable_parameters`` returns ``list(self.critic.parameters())``. The module
trained is the constructor's argument for ``critic``. :func:`held_modules` follows the
method call to it (through one object that delegates to another it holds, as a warm-up
baseline does), so :mod:`dp2ddp.model.outside_wrap` can tell whether it is inside the wrap.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.model.call_args import argument
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.stores import constructor_argument
from dp2ddp.model.syntax import self_attribute_method

_PARAMETERS = frozenset({"parameters", "named_parameters"})


def held_modules(m: SemanticModel, call: ast.AST, depth: int = 0) -> List[ast.AST]:
    """``obj.meth()`` where ``obj`` is bound to objects of classes (the script's or a project
    module's) whose ``meth`` returns the parameters of a module the object keeps from its
    constructor: the constructor's arguments for it, as expressions of this module."""
    from dp2ddp.model.project_defs import class_of_call
    from dp2ddp.model.steps import binding_values

    if depth > 2 or not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return []
    meth = call.func.attr
    if meth in _PARAMETERS or not isinstance(call.func.value, (ast.Name, ast.Attribute)):
        return []
    out: List[ast.AST] = []
    for made in binding_values(m, call.func.value) or []:
        found = class_of_call(m, made) if isinstance(made, ast.Call) else None
        if found is None:
            continue
        cm, cls, _ = found
        method = cm.methods(cls).get(meth)
        if method is None:
            continue
        for ret in (n.value for n in ast.walk(method) if isinstance(n, ast.Return) and n.value is not None):
            if isinstance(ret, ast.Call) and isinstance(ret.func, ast.Name) and ret.func.id == "list" and len(ret.args) == 1:
                ret = argument(ret, ("iterable",), "iterable")  # ``list(self.critic.parameters())``
            read = self_attribute_method(ret) if isinstance(ret, ast.Call) and not ret.args else None
            if read is None:
                continue
            attr, inner = read
            arg = constructor_argument(cm, cls, made, attr)
            if arg is None:
                continue
            if inner in _PARAMETERS:
                out.append(arg)
            elif isinstance(arg, (ast.Name, ast.Attribute)):
                # a baseline that delegates to the one it holds: ``self.baseline.get_learnable_parameters()``
                out.extend(held_modules(m, ast.Call(func=ast.Attribute(value=arg, attr=inner), args=[], keywords=[]), depth + 1))
    return out
