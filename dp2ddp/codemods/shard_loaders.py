"""Shard every training DataLoader between the processes, decided at run time.

DataParallel split each batch across the GPUs; under DDP every process reads batches of
its own. Instead of proving, file by file, where a ``DistributedSampler`` and its
``set_epoch`` would go (they are lost as soon as a loader is handed to a Trainer class,
another module, ``zip`` or a sampler that is ``None`` on one path), the training loader
value is passed through ``shard_loader`` where it is made:

* ``DataLoader(...)`` (and a DataLoader subclass) in the script:
  ``shard_loader(DataLoader(...))``, whatever its arguments (``**kwargs``, a custom sampler,
  a batch sampler, a weighted sampler);
* a loader returned by a function of the project's own modules
  (``train_loader, val_loader = data.get_loaders(args)``): ``train_loader =
  shard_loader(train_loader)`` after the assignment.

``shard_loader`` (written once into the script, :file:`templates/shard_loader.py.tmpl`)
replaces the loader's batch sampler by ``ShardedBatches``: every process draws the
original's batches under one seed per pass and keeps its slice of each. So the global batch,
the order, ``len(loader)`` and the steps per epoch stay the original's, and the shuffle
changes on every pass without ``set_epoch``. With ``--keep-batch-size`` the processes take
whole batches in turn (the per-process batch stays the original's).

Evaluation loaders stay whole on every rank. Loaders the script's own distributed path
already gives a ``DistributedSampler`` (a mixed script) are left to it and to
:mod:`set_epoch`. What cannot be sharded this way (an ``IterableDataset``, ``batch_size=None``,
a training loader returned in a shape the script cannot rebind) is refused.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, InsertAfter, InsertBefore, Replace
from dp2ddp.model.core import is_docstring, kwarg
from dp2ddp.model.loaders import Loader, distributed_sampler, loaders, returned_loaders, sampler_values, subclass_calls
from dp2ddp.model.names import DISTRIBUTED_SAMPLER

SHARD_FUNCTION = "shard_loader"
SHARD_CLASS = "ShardedBatches"


def training_loaders(ctx: Context) -> List[Loader]:
    """Loaders a ``DistributedSampler`` of the script's own already shards (their epoch loops
    get ``set_epoch`` from :mod:`dp2ddp.codemods.set_epoch`)."""
    return ctx.cache.setdefault("training_loaders", [])  # type: ignore[return-value]


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    shared = training_loaders(ctx)
    wrapped: List[Tuple[ast.AST, str]] = []  # (expression that makes a training loader, its label)
    for loader in loaders(m):
        label = loader.label or "DataLoader"
        if distributed_sampler(m, loader.sampler_value) and (ctx.mode == "mixed" or not _partly_distributed(m, loader)):
            shared.append(loader)  # already sharded (a script's own distributed path)
            continue
        if not loader.training:
            out.append(ctx.note(loader.call, "DDP108", f"{loader.label or 'evaluation DataLoader'} stays whole on every rank (each rank evaluates the full set: correct, not sharded)"))
            continue
        why = _cannot_shard(m, loader)
        if why is not None:
            out.append(ctx.block(loader.call, "DDP105", f"{label} {why}"))
            continue
        wrapped.append((loader.call, label))
    for call, label, training in subclass_calls(m):
        if training:
            wrapped.append((call, label))
    rebinds: List[Tuple[ast.stmt, List[str]]] = []
    for call, names, lost in returned_loaders(m):
        if lost is not None:
            out.append(ctx.block(call, "DDP105", lost))
        elif names:
            rebinds.append((m.statement_of(call), names))  # type: ignore[arg-type]
    if not wrapped and not rebinds:
        return out
    if any(f.severity == "error" for f in out):
        return out
    names = _helper_names(ctx)
    fn = names["shard_loader"]
    extra = ", whole_batches=True" if ctx.options.keep_batch_size else ""
    edits = list(_define_helpers(ctx, names))
    for node, label in wrapped:
        edits.append(Replace(ctx.cst(node), lambda u, fn=fn: ctx.expr(f"{fn}({{call}}{extra})", call=u)))
    for stmt, targets in rebinds:
        new = tuple(ctx.stmt(f"{t} = {fn}({t}{extra})") for t in targets)
        edits.append(InsertAfter(ctx.bridge.statement(stmt), new))
    labels = [label for _, label in wrapped] + [t for _, ts in rebinds for t in ts]
    how = (
        "each rank takes whole batches in turn (--keep-batch-size: the per-process batch stays the original's)"
        if ctx.options.keep_batch_size
        else "each rank takes its share of every batch (the global batch, the order and the steps per epoch stay the original's)"
    )
    anchor = wrapped[0][0] if wrapped else rebinds[0][0]
    out.append(ctx.note(anchor, "DDP130", f"{', '.join(dict.fromkeys(labels))} sharded between the ranks by {fn}: {how}; "
                        "a new shuffle on every pass, no set_epoch needed", edits))
    return out


def _partly_distributed(m, loader: Loader) -> bool:
    """``sampler=train_sampler`` where the name holds a DistributedSampler on one path only
    (``DistributedSampler(ds) if args.distributed else None``): on the path that runs
    without that flag nothing shards the loader (``shard_loader`` leaves a DistributedSampler
    as it is at run time)."""
    return any(not m.call_is(v, DISTRIBUTED_SAMPLER) for v in sampler_values(m, loader.sampler_value))


def _cannot_shard(m, loader: Loader) -> Optional[str]:
    if loader.iterable_dataset:
        return ("reads an IterableDataset: dp2ddp cannot split its stream between the ranks (each would read all of it); "
                "shard the dataset by rank in its __iter__ by hand")
    batch = kwarg(loader.call, "batch_size")
    if batch is not None and isinstance(batch.value, ast.Constant) and batch.value.value is None:
        return "has batch_size=None (no batches to split between the ranks): shard its sampler by hand"
    return None


def _helper_names(ctx: Context) -> Dict[str, str]:
    got = ctx.cache.get("shard_helper_names")
    if got is None:
        got = ctx.cache["shard_helper_names"] = {
            "shard_loader": ctx.fresh_name(SHARD_FUNCTION),
            "ShardedBatches": ctx.fresh_name(SHARD_CLASS),
        }
    return got  # type: ignore[return-value]


def _define_helpers(ctx: Context, names: Dict[str, str]):
    """``ShardedBatches`` and ``shard_loader`` after the imports at the top of the module."""
    m = ctx.m
    body = ctx.render(
        "shard_loader.py.tmpl",
        torch=ctx.name("torch"), dist=ctx.name("dist"), os=ctx.name("os"), random=ctx.name("random"), sys=ctx.name("sys"),
        **names,
    )
    body[0] = body[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()] + list(body[0].leading_lines))
    end = m.top_import_end
    if end is not None:
        yield InsertAfter(ctx.bridge.statement(end), tuple(body))
        return
    first = next((s for s in m.tree.body if not is_docstring(s)), None)
    if first is not None:
        yield InsertBefore(ctx.bridge.statement(first), tuple(body))
