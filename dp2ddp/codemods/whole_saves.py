"""A wrapped model saved whole (``torch.save(model, path)``, ``torch.save({"net": net}, path)``)
is saved as the bare module.

Pickling the ``DistributedDataParallel`` object ties the file to the wrapper class and its
process group: the project's evaluation script (no process group) cannot load it. The
migration saves ``model.module`` instead: the model itself, loadable anywhere. Where the
original pickled a DataParallel wrapper and the script reads ``.module`` of what it loads,
or resumes by putting the loaded object back in place of the wrapper after the wrap, the
file is refused: the loaded object is no longer a wrapper. A whole object loaded *before*
the wrap (``if args.resume: net = checkpoint["net"]`` above ``net = DataParallel(net)``) is
wrapped as it comes; a DataParallel object in an old checkpoint is unwrapped first.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import Wrappers
from dp2ddp.engine import Finding, InsertAfter, Replace
from dp2ddp.model.checkpoints import helper_whole_saves, restored_before, whole_wrapper_saves, wrapper_restored

NEEDS = (Wrappers,)


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    keys = ctx.need(Wrappers).keys
    if not keys:
        return []
    out: List[Finding] = []
    for assign in wrapper_restored(m, keys):
        out.append(ctx.block(assign, "DDP138", f"`{m.source(assign.targets[0])}` is replaced by an object loaded from a checkpoint "
                             f"(line {assign.lineno}) after it was wrapped: the migration saves the bare model, so the loaded "
                             "object would replace the DistributedDataParallel wrapper and train unsynchronised; load its "
                             "state_dict into the wrapped model instead"))
    if out:
        return out
    for assign in restored_before(m, keys):
        if not ctx.bridge.alone_on_line(assign):
            continue
        target = m.source(assign.targets[0])
        stmt = ctx.stmt("{t} = {t}.module if isinstance({t}, {torch}.nn.DataParallel) else {t}\n", t=target, torch=ctx.name("torch"))
        out.append(ctx.note(assign, "DDP137", f"`{target}` loaded whole before the wrap: a checkpoint the DataParallel script "
                            "wrote holds the DataParallel wrapper, which is unwrapped before DistributedDataParallel wraps it "
                            "(the migration's own checkpoints hold the bare model)", [InsertAfter(ctx.bridge.statement(assign), (stmt,))]))
    edits = []
    first = None
    seen = set()
    for call, part in whole_wrapper_saves(m, keys):
        if id(part) in seen:
            continue
        seen.add(id(part))
        edits.append(Replace(ctx.cst(part), ctx.expr(ctx.module_of(m.source(part)))))
        first = first or call
    for call, arg, where in helper_whole_saves(m, keys):
        if id(arg) in seen:
            continue
        seen.add(id(arg))
        out.append(ctx.note(call, "DDP137", f"{m.source(call.func)}() saves the `{m.source(arg)}` it is handed whole "
                            f"({where}): it is handed the bare module (`.module`), so the file loads without "
                            "DistributedDataParallel or a process group, as one device's checkpoint",
                            [Replace(ctx.cst(arg), ctx.expr(ctx.module_of(m.source(arg))))]))
    if not edits:
        return out
    return out + [ctx.note(first, "DDP137", "the wrapped model is saved as its bare module (`.module`): the file loads without "
                     "DistributedDataParallel or a process group, as one device's checkpoint", edits)]


__all__ = ["propose"]
