"""DataParallel idioms that mean nothing under DDP.

``if n_gpu > 1: loss = loss.mean()`` averages the per-GPU losses DataParallel gathers;
under DDP each process has one scalar loss and the gradients are averaged in the
backward pass. The ``if`` goes — the same statements lint rule DDP010 reports
(:func:`dp2ddp.model.dp_idioms.dp_loss_means`, one definition for both).

``patch_replication_callback(model)``: a function of the project's own modules that
asserts ``isinstance(model, DataParallel)`` can only fail under DDP; a statement that
just calls it with the wrapper goes (DDP126). A project function that names DataParallel
without asserting it is left, with a warning (DDP111): it will meet a DDP wrapper.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Edit, Finding, Remove
from dp2ddp.model.dp_idioms import asserting_helper_statements, dp_helper_calls, dp_loss_means, is_elif


def propose(ctx: Context) -> List[Finding]:
    out = []
    for node in dp_loss_means(ctx.m):
        if node.orelse or is_elif(ctx.m, node) or not ctx.bridge.alone_on_line(node):
            continue
        out.append(ctx.note(node, "DDP122", "`if <GPU count>: loss = loss.mean()` removed: under DDP each process has one loss",
                            [Remove(ctx.bridge.statement(node))]))
    removable = asserting_helper_statements(ctx.m)
    for h in dp_helper_calls(ctx.m):
        stmt = ctx.m.parent(h.call)
        if id(stmt) in removable and ctx.bridge.alone_on_line(stmt):
            out.append(ctx.note(h.call, "DDP126", f"{h.name}(...) removed: it asserts a DataParallel ({h.where}), which DDP replaces",
                                [Remove(ctx.bridge.statement(stmt))] + _unused_import(ctx, h.call)))
        else:
            out.append(ctx.warn(h.call, "DDP111", f"{h.name} is written for DataParallel ({h.where}) and now receives the DDP "
                                "wrapper: check it under DDP by hand"))
    return out


def _unused_import(ctx: Context, call: ast.Call) -> List[Edit]:
    """``from pkg.mod import helper``: removed when the removed call was its last use."""
    if not isinstance(call.func, ast.Name):
        return []
    name = call.func.id
    return ctx.unused_imports(lambda module, alias: (alias.asname or alias.name) == name)
