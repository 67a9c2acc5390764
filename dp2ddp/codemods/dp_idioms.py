"""DataParallel idioms that mean nothing under DDP.

``if n_gpu > 1: loss = loss.mean()`` averages the per-GPU losses DataParallel gathers;
under DDP each process has one scalar loss and the gradients are averaged in the
backward pass. The ``if`` goes — the same statements lint rule DDP010 reports
(:func:`dp2ddp.model.dp_idioms.dp_loss_means`, one definition for both).

``patch_replication_callback(model)``: a function of the project's own modules that
asserts ``isinstance(model, DataParallel)`` can only fail under DDP; a statement that
just calls it with the wrapper goes (DDP126). A ``save_model(model, ...)`` that unwraps
only a DataParallel (``if isinstance(model, DataParallel): model = model.module``) before
anything else is handed ``model.module``, the model it unwrapped to: its checkpoint keeps
the original's keys (DDP165). One whose type checks name DistributedDataParallel too works
on either wrapper. Any other function written for DataParallel would take its other branch
under DDP: the file is refused (DDP166) unless the helper's module is migrated in the same
plan (``--with-helpers``), where its type checks name DistributedDataParallel.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Edit, Finding, Remove, Replace
from dp2ddp.model.checkpoint_keys import handed_loose_loads
from dp2ddp.model.dp_idioms import BOTH, UNWRAPS, asserting_helper_statements, dp_helper_calls, dp_loss_means, is_elif


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
        elif h.kind == BOTH or ctx.migrated_with(h.path):
            continue  # its type checks name DistributedDataParallel (now or once its module is migrated)
        elif h.kind == UNWRAPS and h.arg is not None:
            text = ctx.m.source(h.arg)
            out.append(ctx.note(h.arg, "DDP165", f"{h.name} unwraps only a DataParallel ({h.where}): it is handed "
                                f"`{text}.module`, the model it unwrapped to, so what it saves keeps the original's keys",
                                [Replace(ctx.cst(h.arg), ctx.expr(ctx.module_of(text)))]))
        else:
            out.append(ctx.block(h.call, "DDP166", f"{h.name} is written for DataParallel ({h.where}: "
                                 f"{_what(h)}) and would be handed the DDP wrapper, which is not one: migrate with "
                                 "`--with-helpers` (its type checks then name DistributedDataParallel too), or make it "
                                 "accept both wrappers"))
    for loose in handed_loose_loads(ctx.m):
        out.append(ctx.block(loose.call, "DDP187", (
            f"{loose.name} loads a state dict into the model it is handed with strict=False ({loose.where}): handed the DDP "
            "wrapper, which takes only `module.` keys, a checkpoint with plain keys (the original's own, written where its "
            "DataParallel did not run: on the CPU or one GPU) would load nothing, and training would start over from "
            "random weights with no error; load with strict=True there (a mismatch then fails loudly), or load into the "
            "bare model after stripping the prefix, then migrate")))
    return out


def _what(h) -> str:
    if h.asserts:
        return "it asserts the model is a DataParallel"
    return "it tests for a DataParallel and does something else for any other model"


def _unused_import(ctx: Context, call: ast.Call) -> List[Edit]:
    """``from pkg.mod import helper``: removed when the removed call was its last use."""
    if not isinstance(call.func, ast.Name):
        return []
    name = call.func.id
    return ctx.unused_imports(lambda module, alias: (alias.asname or alias.name) == name)
