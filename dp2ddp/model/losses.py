"""Losses whose scale depends on how the batch is split.

A ``reduction="sum"`` loss (a ``torch.nn`` loss class or functional) adds up over the
samples a process sees. DataParallel computes it over the whole batch; under DDP each
process sums its share and the gradients are *averaged* across processes, so every step
is 1/world_size of DataParallel's.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import kwarg


def sum_reductions(m: SemanticModel) -> List[ast.keyword]:
    """The ``reduction="sum"`` arguments of ``torch.nn`` losses that may train: a loss
    class (made once, used anywhere), or a functional loss outside ``torch.no_grad()``
    that is not in code apart from the module's ``backward`` calls (an evaluation's summed
    loss changes no gradient)."""
    got = m.cache.get("losses:sum")
    if got is None:
        got = []
        for call in m.nodes(ast.Call):
            arg = kwarg(call, "reduction")
            if arg is not None and isinstance(arg.value, ast.Constant) and arg.value.value == "sum":
                names = m.qualified_names(call.func)
                if not any(q.startswith("torch.nn.") for q in names):
                    continue
                functional = any(q.startswith("torch.nn.functional.") for q in names)
                if functional and (_no_grad(m, call) or not _trains_here(m, call)):
                    continue
                got.append(arg)
        m.cache["losses:sum"] = got
    return got  # type: ignore[return-value]


def _no_grad(m: SemanticModel, node: ast.AST) -> bool:
    from dp2ddp.model.training import under_no_grad

    return under_no_grad(m, node)


def _trains_here(m: SemanticModel, node: ast.AST) -> bool:
    """The function around ``node`` (or module-level code) reaches a ``.backward()`` — itself,
    through what it calls, or in a caller (a loss helper called from the training step).
    A module that calls ``backward`` nowhere (a module of losses, a snippet) may train
    anywhere: it counts as training."""
    if not any(isinstance(c.func, ast.Attribute) for c in m.calls_spelled("backward")):
        return True
    func = m.enclosing_function(node)
    scopes = [func] if func is not None else [m.tree]
    if func is not None:
        scopes += [m.enclosing_function(c) or m.tree for c in m.call_sites(func)]
    for scope in scopes:
        calls = m.calls_in(scope) if scope is m.tree else m.reached_calls(scope)
        if any(isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in calls):
            return True
    return False
