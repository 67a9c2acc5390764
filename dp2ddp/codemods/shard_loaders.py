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
:mod:`set_epoch`. A loader over an ``IterableDataset`` gets ``ShardedStream`` instead: every
process reads the stream (each worker its part, as before) and keeps its slice of every
batch. What cannot be sharded this way (``batch_size=None``, an ``IterableDataset`` under
``--keep-batch-size``, a training loader returned in a shape the script cannot rebind) is
refused.

The parts of this decision have modules of their own: why a loader cannot be shared out
sample by sample (:mod:`loader_refusals`), what the training loops iterate besides the
loaders planned here (:mod:`untraced_feeds`), where the sharded data goes next: other
modules, trainers, pickles (:mod:`loader_handoffs`), and a mixed script's own per-process
batch (:mod:`batch_divide`).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Tuple

import libcst as cst

from dp2ddp.codemods.batch_divide import batch_never_divided, divide_once, switches
from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import OwnSamplers, ShardHelper
from dp2ddp.codemods.loader_handoffs import (
    foreign_training_refusals,
    handed_to_either_refusals,
    handed_trainer_refusals,
    pickled_loaders,
    pulled_batch_refusals,
    read_outside_training,
)
from dp2ddp.codemods.loader_refusals import (
    EVALUATED_TOO,
    cannot_shard,
    groups_of_batches,
    partly_distributed,
    reshaped_whole,
    size_tested,
    sized_by_the_batch,
)
from dp2ddp.codemods.mixed import MixedPlan
from dp2ddp.codemods.untraced_feeds import untraced_feeds
from dp2ddp.engine import Finding, InsertAfter, Replace
from dp2ddp.model.inference import inference_only
from dp2ddp.model.loader_makers import loaders_returned_by, returned_loaders, subclass_calls, training_sites
from dp2ddp.model.loaders import Loader, distributed_sampler, evaluated_apart, loaders
from dp2ddp.model.syntax import kwarg

SHARD_FUNCTION = "shard_loader"
SHARD_CLASS = "ShardedBatches"
STREAM_CLASS = "ShardedStream"


NEEDS = (MixedPlan,)
PROVIDES = (OwnSamplers, ShardHelper)


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    shared: List[Loader] = []
    ctx.provide(OwnSamplers(shared))
    helper = ShardHelper()
    ctx.provide(helper)
    if ctx.role != "helper" and inference_only(m):
        # a script that only evaluates: no loader trains, none is sharded as a training
        # loader (a project's `train_loader, test_loader = data.get(...)` included); shard_eval
        # shares out its evaluation loops, or the file is refused
        helper.evaluation.extend(ld for ld in loaders(m) if not ld.held and not distributed_sampler(m, ld.sampler_value))
        return out
    wrapped: List[Tuple[ast.AST, str]] = []  # (expression that makes a training loader, its label)
    divided: Dict[str, ast.stmt] = {}  # batch value -> the process group's start it is divided after (DDP172)
    rebinds: List[Tuple[ast.stmt, List[str]]] = []  # (statement, the names to shard after it)
    for loader in loaders(m):
        label = loader.label or "DataLoader"
        if distributed_sampler(m, loader.sampler_value):
            partly = partly_distributed(m, loader)
            if ctx.mode == "mixed" or not partly:
                shared.append(loader)  # already sharded (a script's own distributed path)
                given = kwarg(loader.call, "batch_size")
                grown = (batch_never_divided(m, given.value if given is not None else None, switches(ctx))
                         if ctx.mode == "mixed" and loader.training else None)
                if grown is not None and not ctx.options.keep_batch_size and divide_once(ctx, label, loader.call, grown, divided, out):
                    continue
                if not (partly and loader.training):
                    continue
                # the mixed script's own flag (``if args.nodes > 1``) may leave it None under
                # torchrun: shard_loader shards it then, and leaves a DistributedSampler as is
        if loader.held:
            continue  # sharded per object of its class, where a training loop iterates one
        if not loader.training:
            if ctx.options.shard_eval:
                helper.evaluation.append(loader)  # --shard-eval: shard_eval decides, loop by loop
                continue
            out.append(ctx.note(loader.call, "DDP108", f"{loader.label or 'evaluation DataLoader'} stays whole on every rank (each rank evaluates the full set: correct, not sharded)"))
            continue
        why = cannot_shard(m, loader, ctx.options.keep_batch_size)
        if why is None and not ctx.options.keep_batch_size:
            why = (groups_of_batches(m, loader) or reshaped_whole(m, loader) or size_tested(m, loader)
                   # (a script with its own distributed path keeps its own batch per process: SimCLR's NT_Xent)
                   or (sized_by_the_batch(m, loader) if ctx.mode == "plain" else None))
        apart = evaluated_apart(m, loader.call) if why is None and loader.comp is None else None
        if apart is not None:
            why = (f"also makes the loader the evaluation loop at line {apart.lineno} iterates: {EVALUATED_TOO}; build the "
                   "training loader apart, then migrate")
        if why is not None:
            out.append(ctx.block(loader.call, "DDP105", f"{label} {why}"))
            continue
        if loader.comp is not None and set(loader.train_keys) != set(loader.keys):
            # {x: DataLoader(...) for x in ["train", "val"]}: only the training keys' loaders
            if loader.holder is None or not isinstance(m.parent(loader.comp), ast.Assign):
                out.append(ctx.block(loader.call, "DDP105", (
                    f"this DataLoader is made for each key of a dict comprehension and trains for "
                    f"{_keys_text(loader.train_keys)} only, but the dict is not assigned to a name: dp2ddp cannot shard "
                    "those keys alone; assign the dict to a name, or build the training loader on its own")))
                continue
            holder = m.source(loader.holder)
            items = [f"{holder}[{k!r}]" for k in loader.train_keys]
            rebinds.append((m.statement_of(loader.comp), items))  # type: ignore[arg-type]
            for k in loader.keys:
                if k not in loader.train_keys:
                    out.append(ctx.note(loader.call, "DDP108", f"{holder}[{k!r}] stays whole on every rank (each rank evaluates the full set: correct, not sharded)"))
            if not loader.iterable_dataset:
                helper.loaders.append(loader)
            continue
        wrapped.append((loader.call, label))
        if not loader.iterable_dataset:
            helper.loaders.append(loader)  # a stream has no shuffle for set_epoch to follow
    own: List[ast.AST] = []
    for call, label, training in subclass_calls(m):
        given = kwarg(call, "sampler")
        if ctx.mode == "mixed" and given is not None and distributed_sampler(m, given.value):
            own.append(call)  # the mixed script's own distributed path gives it a DistributedSampler
            continue
        if training:
            wrapped.append((call, label))
    for r in returned_loaders(m):
        if ctx.mode == "mixed" and r.own:
            own.append(r.call)  # the project function gives it the own path's DistributedSampler
            # the batch it reads per process there: ``getData(train_bs=args.batch_size)``
            grown = batch_never_divided(m, r.batch, switches(ctx))
            if grown is not None and not ctx.options.keep_batch_size:
                divide_once(ctx, f"the loader {m.source(r.call.func)}() returns", r.call, grown, divided, out)
            continue
        if r.lost is not None:
            out.append(ctx.block(r.call, "DDP105", r.lost))
            continue
        apart = evaluated_apart(m, r.call) if r.names or r.inline else None
        sites = training_sites(m, r) if apart is not None and r.names else None
        if sites:
            rebinds.extend(sites)  # ``train_loader`` where ``_get_data(flag='train')`` binds it; the others stay whole
            continue
        if apart is not None:
            out.append(ctx.block(r.call, "DDP105", (
                f"the loader {m.source(r.call.func)}() returns is also the one the evaluation loop at line {apart.lineno} "
                f"iterates (the same call makes the training and the evaluation loaders): {EVALUATED_TOO}; make the "
                "training loader apart, then migrate")))
            continue
        if r.names:
            rebinds.append((m.statement_of(r.call), r.names))  # type: ignore[arg-type]
        if r.inline:
            wrapped.append((r.call, f"{m.source(r.call.func)}()"))  # ``Trainer(shard_loader(data.loader()), cfg)``
    known = {(id(n), ()) for n, _ in wrapped} | {(id(ld.call), ()) for ld in loaders(m)} | {(id(c), ()) for c in own}
    known |= {(id(ld.comp), (k,)) for ld in loaders(m) if ld.comp is not None for k in ld.keys}
    for r in returned_loaders(m):
        known |= {(id(r.call), p) for p in _returned_paths(m, r.call)}
    lost, named = untraced_feeds(ctx, known)
    out.extend(lost)
    out.extend(pulled_batch_refusals(ctx))
    out.extend(foreign_training_refusals(ctx))
    rebinds.extend(named)
    out.extend(handed_trainer_refusals(ctx, {id(n) for n, _ in wrapped}, {t for _, ts in rebinds for t in ts}))
    out.extend(read_outside_training(ctx, [(n, label) for n, label in wrapped if isinstance(n, ast.Call)]))
    if divided and rebinds:
        # a loader made elsewhere (a project function, a dict of loaders) may read the batch divided
        # above: sliced again by shard_loader, or dealt whole, its global batch cannot be told here
        stmt, names_ = rebinds[0]
        out.append(ctx.block(stmt, "DDP152", (
            f"{', '.join(names_)} trains with a batch size dp2ddp cannot read here, while the script's own distributed "
            f"path reads `{next(iter(divided))}` per process (divided where the process group starts, DDP172): the global "
            "batch of this loader under torchrun cannot be shown to be the DataParallel run's; build it with a DataLoader "
            "in the script, or pass --keep-batch-size")))
    if not wrapped and not rebinds:
        return out
    out.extend(pickled_loaders(ctx, wrapped, rebinds))
    out.extend(handed_to_either_refusals(ctx))
    if any(f.severity == "error" for f in out):
        helper.loaders.clear()
        return out
    names = _helper_names(ctx)
    fn = names["shard_loader"]
    extra = ", whole_batches=True" if ctx.options.keep_batch_size else ""
    edits = list(_define_helpers(ctx, names))
    for node, label in wrapped:
        given = kwarg(node, "batch_size") if isinstance(node, ast.Call) else None
        # a batch divided by the world size already is per process: the loader deals it whole
        whole = ", whole_batches=True" if given is not None and m.source(given.value) in divided else extra
        edits.append(Replace(ctx.cst(node), lambda u, fn=fn, whole=whole: ctx.expr(f"{fn}({{call}}{whole})", call=u)))
    for stmt, targets in rebinds:
        new = tuple(ctx.stmt(f"{t} = {fn}({t}{extra})") for t in targets)
        edits.append(InsertAfter(ctx.bridge.statement(stmt), new))
    labels = [label for _, label in wrapped] + [t for _, ts in rebinds for t in ts]
    how = (
        "each rank takes whole batches in turn (--keep-batch-size: the per-process batch stays the original's)"
        if ctx.options.keep_batch_size
        else ("each rank takes its share of every batch (the global batch, the order and the steps per epoch stay the "
              "original's; a batch that does not split evenly between the ranks is padded with its own first samples, "
              "as DistributedSampler pads)")
    )
    anchor = wrapped[0][0] if wrapped else rebinds[0][0]
    out.append(ctx.note(anchor, "DDP130", f"{', '.join(dict.fromkeys(labels))} sharded between the ranks by {fn}: {how}; "
                        "a new shuffle on every pass", edits))
    return out


def _keys_text(keys) -> str:
    return ", ".join(repr(k) for k in keys)


def _returned_paths(m, call: ast.Call) -> List[tuple]:
    from dp2ddp.model.project_defs import project_def

    found = project_def(m, call.func)
    if found is None:
        return []
    got = loaders_returned_by(found[0], found[1]) or {}
    return [() if k is None else (k,) for k in got]


def _helper_names(ctx: Context) -> Dict[str, str]:
    helper = ctx.need(ShardHelper)
    if not helper.names:
        helper.names.update(shard_loader=ctx.fresh_name(SHARD_FUNCTION), ShardedBatches=ctx.fresh_name(SHARD_CLASS),
                            ShardedStream=ctx.fresh_name(STREAM_CLASS))
    return helper.names


def _define_helpers(ctx: Context, names: Dict[str, str]):
    """``ShardedBatches`` and ``shard_loader`` after the imports at the top of the module."""
    modules = dict(torch=ctx.name("torch"), dist=ctx.name("dist"), os=ctx.name("os"), random=ctx.name("random"), sys=ctx.name("sys"))
    body = ctx.render("shard_loader.py.tmpl", **modules, **names)
    body[0] = body[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()] + list(body[0].leading_lines))
    edit = ctx.helper_edit(body, list(modules.values()))
    if edit is not None:
        yield edit
