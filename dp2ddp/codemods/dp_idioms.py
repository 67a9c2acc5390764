"""DataParallel idioms that mean nothing under DDP.

``if n_gpu > 1: loss = loss.mean()`` averages the per-GPU losses DataParallel gathers;
under DDP each process has one scalar loss and the gradients are averaged in the
backward pass. The ``if`` goes (the same edit as lint rule DDP010's fix).
"""

from __future__ import annotations

import ast
import re
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Remove
from dp2ddp.model.core import SemanticModel, terminal

GPU_COUNT = re.compile(r"n_?gpus?$|num_?gpus?$|gpu_?count$|device_count$|world_size$", re.IGNORECASE)


def tests_gpu_count(m: SemanticModel, test: ast.AST) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute, ast.Call)) and GPU_COUNT.search(terminal(n) or "") for n in ast.walk(test))


def self_mean(stmt: ast.stmt) -> bool:
    """``x = x.mean()`` (the same target on both sides)."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return False
    v = stmt.value
    return (
        isinstance(v, ast.Call)
        and not v.args
        and not v.keywords
        and isinstance(v.func, ast.Attribute)
        and v.func.attr == "mean"
        and ast.dump(v.func.value) == ast.dump(stmt.targets[0], annotate_fields=True).replace("Store()", "Load()")
    )


def loss_mean_ifs(m: SemanticModel) -> List[ast.If]:
    """``if <GPU count test>: x = x.mean()`` with nothing else in it."""
    return [
        n for n in m.nodes(ast.If)
        if not n.orelse and tests_gpu_count(m, n.test) and n.body and all(self_mean(s) for s in n.body)
    ]


def propose(ctx: Context) -> List[Finding]:
    out = []
    for node in loss_mean_ifs(ctx.m):
        if not ctx.bridge.alone_on_line(node):
            continue
        out.append(ctx.note(node, "DDP122", "`if <GPU count>: loss = loss.mean()` removed: under DDP each process has one loss",
                            [Remove(ctx.bridge.statement(node))]))
    return out
