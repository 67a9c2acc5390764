"""Call ``loader.sampler.set_epoch(epoch)`` at the top of the epoch loop.

Without it, ``DistributedSampler`` shuffles every epoch the same way. The epoch loops of
a loader come from the model (:func:`dp2ddp.model.epochs.epoch_loops`): the loader is
followed from where it is built to where it is iterated, and up to the loop that runs
once per epoch, in the same function or around the calls of that function.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import OwnSamplers, ShardHelper
from dp2ddp.engine import Finding, InsertBefore
from dp2ddp.model.epochs import calls_set_epoch, epoch_loops
from dp2ddp.model.syntax import is_docstring


NEEDS = (OwnSamplers, ShardHelper)


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    done: Set[Tuple[int, str]] = set()
    for loader in ctx.need(OwnSamplers).loaders:
        loops = epoch_loops(m, loader)
        placed = False
        for loop, text in loops:
            key = (id(loop), text)
            if key in done or calls_set_epoch(m, loop):
                placed = True
                continue
            f = _insert(ctx, loop, text, ctx.mode == "mixed" and _maybe_other_sampler(m, loader))
            if f is not None:
                out.append(f)
                if f.severity == "info":
                    done.add(key)
                    placed = True
        if not placed:
            got = _reiterations(ctx, done)
            if got:
                out.extend(got)
                placed = True
        if not placed and not _has_set_epoch_anywhere(ctx, loader):
            name = m.source(loader.target) if loader.target is not None else "the training loader"
            out.append(
                ctx.warn(loader.call, "DDP106", f"no epoch loop found for {name}: call {name}.sampler.set_epoch(epoch) at the start of every epoch")
            )
    out.extend(_sharded_epochs(ctx, done))
    return out


def _sharded_epochs(ctx: Context, done: Set[Tuple[int, str]]) -> List[Finding]:
    """Loaders sharded by ``shard_loader``: where their epoch loop is known, the loop tells
    ``ShardedBatches`` its epoch (without it the order follows the passes of this process:
    the same run, but a run resumed at epoch k would replay epoch 0's order). Nothing where no
    epoch loop is found: the pass count is right for a run from the start."""
    m = ctx.m
    helper = ctx.need(ShardHelper)
    if not helper.loaders or not helper.names:
        return []
    out: List[Finding] = []
    for loader in helper.loaders:
        for loop, text in epoch_loops(m, loader):
            key = (id(loop), text + ".batch_sampler")
            if key in done or not isinstance(loop, (ast.For, ast.AsyncFor)) or calls_set_epoch(m, loop):
                continue
            epoch = _epoch_counter(loop)
            body = loop.body
            first = body[1] if is_docstring(body[0]) and len(body) > 1 else body[0]
            if epoch is None or first.lineno == loop.lineno or not ctx.bridge.alone_on_line(first):
                continue
            done.add(key)
            stmt = ctx.stmt(
                "if isinstance({e}.batch_sampler, {S}):\n    {e}.batch_sampler.set_epoch({epoch})\n",
                e=text, S=helper.names["ShardedBatches"], epoch=epoch,
            )
            out.append(ctx.note(loop, "DDP131", f"{text}'s shuffle follows the epoch ({epoch}): a resumed run draws that epoch's order",
                                [InsertBefore(ctx.bridge.statement(first), (stmt,))]))
    return out


def _reiterations(ctx: Context, done: Set) -> List[Finding]:
    """An endless loader (``try: batch = next(it) except StopIteration: it = iter(loader)``,
    deep-text-recognition, ssd.pytorch): a new epoch starts where the iterator is made again,
    so the sampler's epoch advances there."""
    m = ctx.m
    out: List[Finding] = []
    for handler in m.nodes(ast.ExceptHandler):
        if handler.type is None or "StopIteration" not in m.source(handler.type):
            continue
        for stmt in handler.body:
            for call in ast.walk(stmt):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "iter" and len(call.args) == 1):
                    continue
                arg = call.args[0]
                if any(isinstance(n, ast.Call) for n in ast.walk(arg)) or (id(stmt), "reiter") in done:
                    continue
                if not ctx.bridge.alone_on_line(stmt):
                    continue
                done.add((id(stmt), "reiter"))
                e = m.source(arg)
                new = ctx.stmt(
                    "if isinstance({e}.sampler, {S}):\n    {e}.sampler.set_epoch({e}.sampler.epoch + 1)\n",
                    e=e, S=ctx.name("DistributedSampler"),
                )
                out.append(ctx.note(stmt, "DDP131", f"{e}.sampler.set_epoch(...) where the endless loader starts a new epoch",
                                    [InsertBefore(ctx.bridge.statement(stmt), (new,))]))
    return out


def _has_set_epoch_anywhere(ctx: Context, loader) -> bool:
    """A loader of the script's own distributed path whose sampler already gets set_epoch."""
    if ctx.mode != "mixed":
        return False
    return any(isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch" for c in ctx.m.nodes(ast.Call))


def _epoch_counter(loop: ast.AST) -> Optional[str]:
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        if isinstance(loop.target, ast.Name):
            return loop.target.id
        it = loop.iter
        if (
            isinstance(loop.target, ast.Tuple)
            and loop.target.elts
            and isinstance(loop.target.elts[0], ast.Name)
            and isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and it.func.id == "enumerate"
        ):
            return loop.target.elts[0].id
    return None


def _maybe_other_sampler(m, loader) -> bool:
    """The loader's sampler may be another one (``RandomSampler(ds) if local_rank == -1
    else DistributedSampler(ds)``): then ``set_epoch`` only when it has one."""
    from dp2ddp.model.loaders import sampler_values
    from dp2ddp.model.names import DISTRIBUTED_SAMPLER

    values = sampler_values(m, loader.sampler_value) if loader.sampler is not None else []
    return any(not m.call_is(v, DISTRIBUTED_SAMPLER) for v in values)


def _insert(ctx: Context, loop: ast.AST, expr_text: str, conditional: bool = False) -> Optional[Finding]:
    m = ctx.m
    if loop.body[0].lineno == loop.lineno:  # type: ignore[attr-defined]
        return ctx.warn(loop, "DDP106", f"one-line epoch loop: call {expr_text}.sampler.set_epoch(epoch) by hand")
    epoch = _epoch_counter(loop)
    if epoch is None:
        return ctx.warn(loop, "DDP106", f"epoch loop without an epoch counter: call {expr_text}.sampler.set_epoch(epoch) by hand")
    body = loop.body  # type: ignore[attr-defined]
    first = body[1] if is_docstring(body[0]) and len(body) > 1 else body[0]
    if not ctx.bridge.alone_on_line(first):
        return ctx.warn(loop, "DDP106", f"call {expr_text}.sampler.set_epoch({epoch}) at the start of every epoch")
    if conditional:
        stmt = ctx.stmt("if isinstance({e}.sampler, {S}):\n    {e}.sampler.set_epoch({epoch})\n", e=expr_text, epoch=epoch, S=ctx.name("DistributedSampler"))
    else:
        stmt = ctx.stmt("{e}.sampler.set_epoch({epoch})", e=expr_text, epoch=epoch)
    return ctx.note(
        loop,
        "DDP131",
        f"{expr_text}.sampler.set_epoch({epoch}) at the start of every epoch, so each epoch shuffles differently",
        [InsertBefore(ctx.bridge.statement(first), (stmt,))],
    )
