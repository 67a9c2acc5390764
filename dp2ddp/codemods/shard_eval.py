"""``rewrite --shard-eval``: evaluation loops whose results are sums run on each rank's
own batches.

By default every evaluation loader stays whole on every rank (DDP108): exact, and the
evaluation takes as long as on one device. With ``--shard-eval`` each loop over one of
those loaders (:mod:`dp2ddp.model.eval_loops`) whose results are provably sums is shared
out by whole batches:

* ``for ... in enumerate(test_loader)`` becomes ``for ... in enumerate(test_loader_pass)``
  with ``test_loader_pass = EvalPass(test_loader)`` before the loop: rank ``r`` evaluates
  the original's batches ``r, r + world, ...``, so every batch's values (a batch mean, a
  batch's correct count) are the original's, with no padding and no duplicate; ``len()``
  stays the loader's;
* the accumulators are handed to the pass before the loop (``correct, total =
  test_loader_pass.track(correct, total)``: each ``+=`` is kept with its batch) and taken
  back after it (``correct, total = test_loader_pass.total(correct, total)``): every rank's
  additions, gathered and added up in the original's order of batches, so floats come out
  to the last bit as the original's (an all-reduce of partial sums would not);
* ``enumerate``'s index read after the loop gets the original's last value back
  (``batch_idx = test_loader_pass.last_index(batch_idx)``).

The helpers (:file:`templates/shard_eval.py.tmpl`) are written once into the script. A
loop that cannot be proven to leave only sums stays whole on every rank, with a warning
that names the reason (DDP161); a loader no loop of the script iterates keeps DDP108.

A script that only evaluates (:func:`dp2ddp.model.inference.inference_only`) gets this
without the option: its migration is worth making only if its inference is shared out,
so it migrates when every evaluation loop is (DDP168), and is refused otherwise, with the
loop and the reason (DDP115): a loop or a loader left whole would make every rank repeat
the whole inference.
"""

from __future__ import annotations

import ast
from typing import Dict, List

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import ShardHelper
from dp2ddp.engine import Edit, Finding, InsertAfter, InsertBefore, Replace
from dp2ddp.model.syntax import is_docstring, terminal
from dp2ddp.model.eval_loops import EvalLoop, eval_loops
from dp2ddp.model.inference import inference_only, no_training_message, unseen_training
from dp2ddp.model.wraps import dp_wraps

NEEDS = (ShardHelper,)


def propose(ctx: Context) -> List[Finding]:
    evaluation = ctx.need(ShardHelper).evaluation
    m = ctx.m
    inference = ctx.role != "helper" and inference_only(m)
    unseen = unseen_training(m) if ctx.role != "helper" and not inference else None
    if unseen is not None:
        node, what = unseen
        return [ctx.block(node, "DDP115", (
            f"nothing in this script or the project code it runs trains (no backward pass, no optimizer.step(), no optimizer "
            f"made), and {what}: if that code only evaluates, every rank would repeat the whole of it, which DataParallel "
            "split between the GPUs of one process; if it trains, dp2ddp cannot find the data it trains on to shard (a "
            "loader named for training is no proof); keep DataParallel here, or migrate by hand"))]
    loops = eval_loops(m, evaluation, made_elsewhere=inference) if ctx.mode == "plain" and (evaluation or inference) else []
    if not evaluation and not loops:
        if inference:
            return [ctx.block(dp_wraps(m)[0].call, "DDP115", no_training_message())]
        return []
    out: List[Finding] = []
    iterated = {id(ld.call) for e in loops for ld in e.loaders}
    for ld in evaluation:
        if id(ld.call) not in iterated:
            why = ("the script has its own distributed path" if ctx.mode != "plain" else
                   "no loop of this script iterates it where --shard-eval can follow")
            label = ld.label or "evaluation DataLoader"
            if inference:
                out.append(ctx.block(ld.call, "DDP115", no_training_message(f"`{label}` (line {ld.call.lineno}) "
                                     f"cannot be shared out: {why}")))
                continue
            out.append(ctx.note(ld.call, "DDP108", f"{label} stays whole on every rank "
                                f"(each rank evaluates the full set: correct, not sharded): {why}"))
    names: Dict[str, str] = {}
    for e in loops:
        label = m.source(e.iterable)
        line = e.loop.lineno
        if e.problem is not None:
            if inference:
                out.append(ctx.block(e.problem_node or e.loop, "DDP115", no_training_message(
                    f"its evaluation loop over `{label}` (line {line}) cannot be shared out: {e.problem}")))
                continue
            out.append(ctx.warn(e.problem_node or e.loop, "DDP161", f"--shard-eval: the evaluation loop over `{label}` "
                                f"(line {line}) stays whole on every rank: {e.problem}"))
            continue
        if not names:
            names = _define(ctx)
        out.append(_shard(ctx, e, names))
    if inference and not any(f.severity == "error" for f in out):
        out.append(ctx.note(dp_wraps(m)[0].call, "DDP168", (
            "inference only (no training step in this file): every evaluation loop is shared out between the ranks "
            "by whole batches, as with --shard-eval, so each rank evaluates its own batches and every rank ends with "
            "the original's results (a loader whose order is not fixed at run time, such as a shuffled one, is read "
            "whole on every rank)")))
    return out


def _define(ctx: Context) -> Dict[str, str]:
    """The helpers, once, after the imports at the top of the module."""
    m = ctx.m
    names = {n: ctx.fresh_name(n) for n in ("EvalPass", "EvalBatches", "EvalSum", "EvalElement", "EvalList")}
    body = ctx.render("shard_eval.py.tmpl", torch=ctx.name("torch"), dist=ctx.name("dist"), **names)
    body[0] = body[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()] + list(body[0].leading_lines))
    end = m.top_import_end
    if end is not None:
        ctx.extra_edits.append(InsertAfter(ctx.bridge.statement(end), tuple(body)))
    else:
        first = next(s for s in m.tree.body if not is_docstring(s))
        ctx.extra_edits.append(InsertBefore(ctx.bridge.statement(first), tuple(body)))
    return names


def _shard(ctx: Context, e: EvalLoop, names: Dict[str, str]) -> Finding:
    m = ctx.m
    label = m.source(e.iterable)
    base = terminal(e.iterable) if isinstance(e.iterable, (ast.Name, ast.Attribute)) else "eval_loader"
    pass_name = ctx.fresh_name(f"{base}_pass")
    loop = ctx.bridge.statement(e.loop)
    before = [ctx.stmt("{p} = {cls}({loader})  # dp2ddp: this rank's whole batches of the loader (--shard-eval)\n",
                       p=pass_name, cls=names["EvalPass"], loader=e.iterable)]
    after = []
    accs = ", ".join(e.accumulators)
    if e.accumulators:
        before.append(ctx.stmt("{a} = {p}.track({a})\n", a=accs, p=pass_name))
        what = "sums and items" if e.lists else "sums"
        after.append(ctx.stmt("{a} = {p}.total({a})  # dp2ddp: every rank's {w}, in the original's order\n", w=what,
                              a=accs, p=pass_name))
    if e.index is not None:
        after.append(ctx.stmt("{i} = {p}.last_index({i})\n", i=e.index, p=pass_name))
    if e.cap is not None:
        # `enumerate(loader)` -> `loader_pass.numbered()`: the batch numbers its `break` tests are the original's
        start = (list(e.loop.iter.args[1:]) + [k.value for k in e.loop.iter.keywords])  # type: ignore[attr-defined]
        header = Replace(ctx.cst(e.loop.iter), ctx.expr("{p}.numbered({s})", p=pass_name, s=m.source(start[0]) if start else ""))
    else:
        header = Replace(ctx.cst(e.iterable), ctx.expr(pass_name))
    edits: List[Edit] = [InsertBefore(loop, tuple(before)), header]
    if after:
        edits.append(InsertAfter(loop, tuple(after)))
    summed = [a for a in e.accumulators if a not in e.lists]
    parts = [f"{', '.join(f'`{a}`' for a in summed)} added up"] if summed else []
    parts += [f"{', '.join(f'`{a}`' for a in e.lists)} collected"] if e.lists else []
    sums = f"; {' and '.join(parts)} after it in the original's order" if parts else ""
    elsewhere = ("; made by a call dp2ddp does not read, it is shared out where it is a DataLoader whose order "
                 "is fixed, and read whole on every rank otherwise" if not e.loaders else "")
    if e.cap is not None:
        sums += (f"; it stops at a batch number (line {e.cap.lineno}): each rank numbers its batches as the original "
                 "did and stops there, so the ranks evaluate exactly the original's batches")
    message = (
        f"--shard-eval: the evaluation loop over `{label}` (line {e.loop.lineno}) is shared out by whole batches "
        f"(rank r evaluates the original's batches r, r + world, ...; whole on every rank where the loader has "
        f"fewer batches than ranks{elsewhere}){sums}: the same values on every rank as the original's"
    )
    return ctx.note(e.loop, "DDP160", message, edits)
