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
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Tuple

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import OwnSamplers, ShardHelper
from dp2ddp.codemods.mixed import MixedPlan
from dp2ddp.engine import Finding, Guard, InsertAfter, Replace
from dp2ddp.model.batch_division import Division, division_site
from dp2ddp.model.batch_shapes import fixed_reshapes
from dp2ddp.model.dp_idioms import GPU_COUNT, identifiers_in
from dp2ddp.model.flow import origins
from dp2ddp.model.held_loaders import held_loader
from dp2ddp.model.inference import inference_only
from dp2ddp.model.loader_makers import loaders_returned_by, returned_loaders, subclass_calls, training_sites
from dp2ddp.model.loaders import Loader, distributed_sampler, evaluated_apart, grouped_batches, loaders, sampler_values
from dp2ddp.model.names import DATALOADER, DISTRIBUTED_SAMPLER
from dp2ddp.model.syntax import is_main_test, kwarg, terminal
from dp2ddp.model.training_feeds import NOT_DATA

SHARD_FUNCTION = "shard_loader"
SHARD_CLASS = "ShardedBatches"
STREAM_CLASS = "ShardedStream"


NEEDS = (MixedPlan,)
PROVIDES = (OwnSamplers, ShardHelper)

# why a loader an evaluation loop also reads is not sharded (evaluated_apart)
_EVALUATED_TOO = ("sharding it would shard that evaluation too (each rank's own metric; an early stop or a best-model "
                  "choice that differs between the ranks stops one of them in a collective)")


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
            partly = _partly_distributed(m, loader)
            if ctx.mode == "mixed" or not partly:
                shared.append(loader)  # already sharded (a script's own distributed path)
                given = kwarg(loader.call, "batch_size")
                grown = (_batch_never_divided(m, given.value if given is not None else None, _switches(ctx))
                         if ctx.mode == "mixed" and loader.training else None)
                if grown is not None and not ctx.options.keep_batch_size and _divide_once(ctx, label, loader.call, grown, divided, out):
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
        why = _cannot_shard(m, loader, ctx.options.keep_batch_size)
        if why is None and not ctx.options.keep_batch_size:
            why = (_groups_of_batches(m, loader) or _reshaped_whole(m, loader) or _size_tested(m, loader)
                   # (a script with its own distributed path keeps its own batch per process: SimCLR's NT_Xent)
                   or (_sized_by_the_batch(m, loader) if ctx.mode == "plain" else None))
        apart = evaluated_apart(m, loader.call) if why is None and loader.comp is None else None
        if apart is not None:
            why = (f"also makes the loader the evaluation loop at line {apart.lineno} iterates: {_EVALUATED_TOO}; build the "
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
            grown = _batch_never_divided(m, r.batch, _switches(ctx))
            if grown is not None and not ctx.options.keep_batch_size:
                _divide_once(ctx, f"the loader {m.source(r.call.func)}() returns", r.call, grown, divided, out)
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
                f"iterates (the same call makes the training and the evaluation loaders): {_EVALUATED_TOO}; make the "
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
    lost, named = _untraced_feeds(ctx, known)
    out.extend(lost)
    out.extend(_pulled_batches(ctx))
    out.extend(_foreign_training(ctx))
    rebinds.extend(named)
    out.extend(_handed_trainers(ctx, {id(n) for n, _ in wrapped}, {t for _, ts in rebinds for t in ts}))
    out.extend(_read_outside_training(ctx, [(n, label) for n, label in wrapped if isinstance(n, ast.Call)]))
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
    out.extend(_pickled_loaders(ctx, wrapped, rebinds))
    out.extend(_handed_to_either(ctx))
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


def _groups_of_batches(m, loader: Loader) -> Optional[str]:
    """Why a loader whose items are groups of batches cannot be shared out sample by sample:
    its ``collate_fn`` cuts each rank's share into batches of a size of its own (the
    dataset's), so every step's global batch would grow by the world size."""
    for ld, outer, inner in grouped_batches(m):
        if ld.call is loader.call:
            return (f"hands the loop at line {outer.lineno} groups of batches (its collate_fn cuts each loader batch into "
                    f"batches the loop at line {inner.lineno} trains on, one step each): shared out sample by sample, "
                    "each rank's share would be cut into batches of the collate_fn's own size, and every step's global "
                    "batch would grow by the world size; migrate with --keep-batch-size (each rank takes whole groups "
                    "in turn: the per-process batch stays the original's), or cut the batches outside the collate_fn")
    return None


def _sized_by_the_batch(m, loader: Loader) -> Optional[str]:
    """Why a loader whose batch size also sizes another object (a loss whose grids are made
    for that many images) cannot be shared out sample by sample."""
    from dp2ddp.model.batch_shapes import batch_sized_objects

    for call, param in batch_sized_objects(m, loader.batch_size):
        return (f"has the batch size that `{ast.unparse(call.func)}(...)` (line {call.lineno}) is built for (its `{param}`): "
                "shared out sample by sample, each rank's part of a batch would not be the batch that object expects (a "
                "loss whose tensors are made for that many images fails, or weighs them wrongly); migrate with "
                "--keep-batch-size (each rank takes whole batches in turn: the per-process batch stays the original's), "
                "or build it from the batch it is handed")
    return None


def _size_tested(m, loader: Loader) -> Optional[str]:
    """Why a loader whose batch size the training compares with a batch's own size cannot be
    shared out sample by sample."""
    from dp2ddp.model.batch_shapes import batch_size_tests

    for c in batch_size_tests(m, loader.batch_size):
        return (f"has the batch size that line {c.lineno} compares a batch's own size with (`{ast.unparse(c)[:60]}`): shared "
                "out sample by sample, each rank's part of a batch is smaller than that, so the test would give another "
                "answer on every step (a short batch skipped: every batch skipped); migrate with --keep-batch-size (each "
                "rank takes whole batches in turn: the per-process batch stays the original's), or compare with the "
                "batch the loader was made for on each rank")
    return None


def _reshaped_whole(m, loader: Loader) -> Optional[str]:
    """Why a loader whose batches the training step reshapes by fixed sizes (few-shot
    episodes) cannot be shared out sample by sample."""
    from dp2ddp.model.training_feeds import iterated

    for loop, call, where in fixed_reshapes(m):
        if not isinstance(loop, ast.For):
            continue
        made = {id(node) for e in iterated(loop.iter) for node, path in origins(m, e) if not path}
        if id(loader.call) in made:
            return (f"feeds a training step that reshapes its batch by sizes of its own (`{ast.unparse(call)[:70]}`, "
                    f"{where}): shared out sample by sample, each rank's part of a batch would not have that shape (an "
                    "episode cut in two, or a view that fails); migrate with --keep-batch-size (each rank takes whole "
                    "batches in turn: the per-process batch stays the original's)")
    return None


def _keys_text(keys) -> str:
    return ", ".join(repr(k) for k in keys)


def _returned_paths(m, call: ast.Call) -> List[tuple]:
    from dp2ddp.model.project_defs import project_def

    found = project_def(m, call.func)
    if found is None:
        return []
    got = loaders_returned_by(found[0], found[1]) or {}
    return [() if k is None else (k,) for k in got]




def _keeps_sharded_loaders(m, node: ast.AST) -> bool:
    """``node`` makes an object of a class of this script that builds training DataLoaders
    itself (deep-text-recognition's ``Batch_Balanced_Dataset``, one loader per data source,
    pulled with ``get_batch()``): they are sharded where the class makes them."""
    from dp2ddp.model.project_defs import class_of_call

    found = class_of_call(m, node)
    return found is not None and found[0] is m and any(ld.training and m.contains(found[1], ld.call) for ld in loaders(m))


def _untraced_feeds(ctx: Context, known: set) -> Tuple[List[Finding], List[Tuple[ast.stmt, List[str]]]]:
    """Values training loops iterate that are not a loader sharded above. Each is

    * passed through when it is a call that wraps a sharded loader (``inf_loop(loader)``,
      ``Prefetcher(loader)``: a project's iterator wrapper);
    * sharded at run time where the script names it, when that name says it holds a loader
      (``data_loader = config.init_obj("data_loader", module)``: ``data_loader =
      shard_loader(data_loader)`` after it, and shard_loader fails loudly on anything but a
      DataLoader);
    * else refused: a generator, a list of batches, a value of unknown make — every rank
      would train on all of it."""
    from dp2ddp.model.batches import hand_loops
    from dp2ddp.model.flow import origins
    from dp2ddp.model.phase_keys import fed_origins
    from dp2ddp.model.settings_loops import settings_loops
    from dp2ddp.model.training_feeds import fed_values, handed_values

    m = ctx.m
    unknown: List[Tuple[ast.AST, ast.AST, ast.AST]] = []  # (origin, value, loop)
    seen = set()
    # batches a loop cuts from its own tensors (``zip(x.split(bs), y.split(bs))``) are
    # shared by rank by hand_batches: not a loader to trace
    cut = [c.node for hl in hand_loops(m) for c in hl.cuts if c.kind == "iterable"]
    settings = {id(s.loop): s for s in settings_loops(m)}
    out: List[Finding] = []
    for value, loop in fed_values(m) + handed_values(m):  # loop: a training loop, or the call handing it to one
        if any(c is value or m.contains(c, value) for c in cut):
            continue
        s = settings.get(id(loop))
        if s is not None and s.same:
            continue  # a list of settings, not data: every rank runs every item, as the original did
        if s is not None and s.unsure is not None and s.within is not None and id(loop) not in seen:
            seen.add(id(loop))
            out.append(ctx.block(value, "DDP105", _unsure_settings(m, s)))
            continue
        found = fed_origins(m, value, loop) if not isinstance(loop, ast.Call) else origins(m, value)
        for node, path in found:
            if (id(node), path) in known or (id(node), ()) in known or id(node) in seen:
                continue
            if isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.JoinedStr)):
                continue
            if isinstance(node, ast.Call) and (terminal(node.func) in NOT_DATA or m.call_is(node, DATALOADER)):
                continue
            if _handed_by_entry(ctx, node):
                continue  # the entry script's migration shards what it hands this parameter
            if _keeps_sharded_loaders(m, node):
                continue  # an object of this script's class whose own loaders are sharded where it makes them
            seen.add(id(node))
            unknown.append((node, value, loop))
    rebinds: List[Tuple[ast.stmt, List[str]]] = []
    feeds = {id(n) for n, _, _ in unknown} | {k[0] for k in known}
    for node, _value, _loop in unknown:
        if _wraps(m, node, feeds):
            continue  # a wrapper of a loader: decided once that loader is
        target = _loader_name(m, node, _value) or _holder_name(m, node)
        if target is None:
            continue
        stmt = m.statement_of(node)
        known.add((id(node), ()))
        if _on_some_paths(m, stmt):
            # sharded after it, the name would stay unsharded on the path that skips it (a
            # Prefetcher made only ``if prefetch:``, the loader itself set by a base class
            # in another module on the other path)
            out.append(ctx.block(node, "DDP105", f"`{target}` is set here only on some paths (line {m.position(stmt)[0]} is "  # type: ignore[arg-type]
                                 "under a condition) and comes from elsewhere on the others: dp2ddp cannot shard it on "
                                 "every path; shard the loader where it is made, by hand"))
            continue
        rebinds.append((stmt, [target]))  # type: ignore[arg-type]
    for node, value, loop in unknown:
        if (id(node), ()) in known or _wraps_known(m, node, known) or _yields_known(m, node, known) or _collects_known(m, node, known):
            continue
        line = m.position(loop)[0]
        what = m.source(node)
        what = what if len(what) <= 60 else what[:57] + "..."
        where = (f"the training loop at line {line}" if not isinstance(loop, ast.Call) else
                 f"`{m.source(loop.func)}(...)` (line {line}, whose training loop is in another module)")
        imported = _imported_by_name(m, node)
        if imported is not None:
            out.append(ctx.block(value, "DDP105", (
                f"{where} iterates `{m.source(value)}`, which on one path is what `{what}` (line {m.position(node)[0]}) returns: "
                f"a function of a module imported by name at run time (`{m.source(imported)}`, line {m.position(imported)[0]}) "
                "that dp2ddp cannot read, so it cannot shard what it returns (every rank would train on all of it); "
                "build that loader with a DataLoader in the script, or shard it in that module by hand")))
            continue
        out.append(ctx.block(value, "DDP105", f"{where} iterates `{m.source(value)}`, made by `{what}` "
                             f"(line {m.position(node)[0]}), which dp2ddp cannot trace to a DataLoader: every rank would train "
                             "on all of it; shard it by hand or build it with a DataLoader"))
    return out, rebinds


def _pulled_batches(ctx: Context) -> List[Finding]:
    """DDP105 for a training loop over a count whose batch comes from a call that is no
    loader dp2ddp can shard (``sess.run(train_iter)``, ``get_batch()`` drawing positions at
    random): under DDP every rank would pull a whole batch of its own."""
    from dp2ddp.model.pulled_batches import pulled_batches

    m = ctx.m
    out: List[Finding] = []
    for p in pulled_batches(m):
        what = " ".join(m.source(p.source).split())
        what = what if len(what) <= 60 else what[:57] + "..."
        line = m.position(p.source)[0]
        if p.how == "drawn":
            how = (f"`{what}` (line {line}) draws its batch at random positions: every rank would draw the same positions "
                   "(its random streams are rank 0's) and train on the whole batch, doing all the work DataParallel "
                   "split; draw the positions once and take this rank's share of them by hand, or sample with a DataLoader")
        else:
            how = (f"`{what}` (line {line}) hands it a batch from something dp2ddp cannot shard: every rank would pull a "
                   "whole batch of its own each step (the global batch times the world size, or the same batch on every "
                   "rank doing all the work); make the batches with a DataLoader, or give each rank its share by hand")
        out.append(ctx.block(p.source, "DDP105", f"the training loop at line {m.position(p.loop)[0]} takes its batch from no "
                             f"DataLoader: {how}"))
    return out


def _imported_by_name(m, node: ast.AST) -> Optional[ast.Call]:
    """``lib.data_loader(...)`` where ``lib = importlib.import_module(name)``: that call."""
    from dp2ddp.model.flow import origins

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    for made, _ in origins(m, node.func.value):
        if isinstance(made, ast.Call) and m.qualified_names(made.func) & {"importlib.import_module", "builtins.__import__"}:
            return made
    return None


def _unsure_settings(m, s) -> str:
    """DDP105 for a loop over settings whose items may differ between the ranks."""
    line = m.position(s.loop)[0]
    inside = (f", inside the training step of the loop at line {m.position(s.within)[0]} (a backward pass per item before one "
              "optimizer step)" if s.within is not None else "")
    return (f"the training loop at line {line} iterates `{' '.join(m.source(s.value).split())}`, a list of settings, not data{inside}; but "
            f"dp2ddp cannot show its items are the same on every rank (`{m.source(s.unsure)}`, line {m.position(s.unsure)[0]}): "
            "ranks that train different items would have DDP average unrelated gradients; make the items from the script's "
            "options or constants, or draw them alike on every rank and migrate by hand")


def _foreign_training(ctx: Context) -> List[Finding]:
    """A call into project code that trains on a loader made there, in a module this
    migration does not edit (a helper of the same project migration shards its own):
    refused, every rank would train on all of it."""
    from dp2ddp.model.foreign_training import foreign_training

    out: List[Finding] = []
    for f in foreign_training(ctx.m):
        if ctx.migrated_with(f.module):
            continue
        out.append(ctx.block(f.call, "DDP105", f"`{ctx.m.source(f.call.func)}(...)` reaches a training loop ({f.loop}) over "
                             f"`{f.value}`, made there ({f.made}) in a module this migration does not edit: every rank would "
                             "train on all of it; migrate that module with the script (`--with-helpers` shards the loader "
                             "there), or make the loader in the script and pass it in"))
    return out


def _read_outside_training(ctx: Context, sharded: List[Tuple[ast.Call, str]]) -> List[Finding]:
    """A loader this migration shards, also read by a loop that only computes a statistic of
    its batches (:func:`dp2ddp.model.statistic_loops.statistic_loops`): sharded, each rank would
    compute it over its own share and the ranks would train with different values. Refused
    with the loop."""
    from dp2ddp.model.statistic_loops import statistic_loops

    labels = {id(c): label for c, label in sharded}
    return [ctx.block(loop, "DDP105", f"{labels[id(call)]} is sharded between the ranks, but the loop at line {loop.lineno} also "
                      "reads it and trains nothing (a statistic of the training set, such as class weights or a "
                      "mean): each rank would compute it over its own share only, and the ranks would go on with "
                      "different values; compute it over a loader of its own (kept whole), then migrate")
            for loop, call in statistic_loops(ctx.m, [c for c, _ in sharded])]


def _handed_trainers(ctx: Context, sharded_calls: set, sharded_names: set) -> List[Finding]:
    """The model handed to project code that trains it over data it finds there
    (:func:`dp2ddp.model.foreign_training.handed_trainers`), in a module this migration does not
    edit, with no loader this migration shards handed in beside it: refused, every rank
    would train on all of that data."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.foreign_training import handed_trainers, unfollowed_trainers

    m = ctx.m
    out: List[Finding] = [ctx.block(c, "DDP105", (
        f"`{m.source(c.func)}(...)` is handed the model, and dp2ddp cannot tell what it runs (a callee picked at run "
        "time); this script has no backward pass of its own, so that code trains the model, on loaders and with writes "
        "dp2ddp cannot see: every rank could train on all of the data and write the same files; call the trainer by its "
        "name (a class of the project), then migrate")) for c in unfollowed_trainers(m)]
    for h in handed_trainers(m):
        if ctx.migrated_with(h.module):
            continue
        values = list(h.call.args) + [k.value for k in h.call.keywords]
        if any(m.source(v) in sharded_names or any(id(n) in sharded_calls for n, _ in origins(m, v)) for v in values):
            continue  # a loader this migration shards is handed in (a Trainer(model, train_loader) shape)
        out.append(ctx.block(h.call, "DDP105", f"`{m.source(h.call.func)}(...)` is handed the model and trains it in project code "
                             f"this migration does not edit (a loop over data at {h.loop}, a backward pass at {h.step}), "
                             "on data it gets itself: no loader this migration shards is handed in, so every rank would "
                             "train on all of it; hand it a loader the script makes, or shard its loader there by hand"))
    return out


def _handed_by_entry(ctx: Context, node: ast.AST) -> bool:
    """In a project module migrated with its entry script: ``node`` is a parameter of a
    function here (a class's ``__init__``) that only callers elsewhere bind, and the entry
    script hands it the training value (:attr:`dp2ddp.migrate.Options.handed`)."""
    handed = getattr(ctx.options, "handed", ())
    if not handed or not isinstance(node, ast.Name):
        return False
    m = ctx.m
    _, bindings = m.lookup(node.id, m.scope_of(node))
    if not bindings or any(b.kind != "param" for b in bindings):
        return False
    fn = bindings[0].scope.node  # the function whose parameter it is
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (fn.name, fn.lineno, node.id) in handed


def _pickled_loaders(ctx: Context, wrapped, rebinds) -> List[Finding]:
    """A loader this migration shards that the script also pickles (``torch.save(trainloader,
    path)`` for another script to reuse: loss-landscape's ``trainloader.dat``): the file would
    hold the sharding wrapper, a class of the migrated script no other script can import, and
    one rank's share. Refused at the save."""
    from dp2ddp.model.checkpoints import saved_parts
    from dp2ddp.model.flow import origins
    from dp2ddp.model.names import DUMPS, SAVE

    m = ctx.m
    # the loaders sharded where they are made, and the values rebound to shard_loader(...) after
    sharded = {id(n) for n, _ in wrapped} | {id(stmt.value) for stmt, _ in rebinds if isinstance(stmt, ast.Assign)}
    rebound = {t for _, ts in rebinds for t in ts}
    out: List[Finding] = []
    for call in m.nodes(ast.Call):
        if not m.is_name(call.func, SAVE | DUMPS):
            continue
        # what the call writes, through dicts, lists and tuples: the loader itself, not a
        # number made from it (``"iters": epochs * len(trainloader)``)
        for n in saved_parts(m, call):
            if not isinstance(n, (ast.Name, ast.Attribute)):
                continue
            hit = m.source(n) in rebound or any(id(node) in sharded for node, _ in origins(m, n))
            if hit:
                out.append(ctx.block(call, "DDP105", (
                    f"`{m.source(n)}` is sharded between the ranks, and `{m.source(call.func)}` (line {call.lineno}) "
                    "pickles it: the file would hold the migration's sharding wrapper, a class of the migrated script that "
                    "no other script can load, and one rank's share; save what the loader is made from (the dataset, "
                    "the indices) instead, then migrate")))
                break
    return out


def _handed_to_either(ctx: Context) -> List[Finding]:
    """The loader handed to a method of whichever of several project classes the script made
    (:func:`dp2ddp.model.training_feeds.handed_to_either`), one training on it and one not:
    sharded for the first, the other would see each rank's share. Refused at the call."""
    from dp2ddp.model.training_feeds import handed_to_either

    m = ctx.m
    return [ctx.block(call, "DDP105", (
        f"`{m.source(arg)}` is handed to `{m.source(call.func)}(...)`, which is {trains} (it trains on it) or {idle} (it does "
        f"not) depending on the path: sharded for training, the path through {idle} would read each rank's share only "
        "(an evaluation of half the data); make the two calls apart, each with its own loader, then migrate"))
        for call, arg, trains, idle in handed_to_either(m)]


def _loader_name(m, node: ast.AST, value: Optional[ast.AST] = None) -> Optional[str]:
    """``name = <call>`` where the name says it holds a loader; or ``train_loader,
    test_loader = dataset.get10(...)`` (a project helper that returns its loaders in a
    list), where ``value``, the name the training loop iterates, is one of the names
    unpacked and says it holds a loader; or ``trainloader = data.loader_train``, an attribute of
    an object of the project's (HRank's data holder) whose name says it holds a loader."""
    if not (isinstance(node, ast.Call) or (isinstance(node, ast.Attribute) and "loader" in node.attr.lower())):
        return None
    parent = m.parent(node)
    if not (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1):
        return None
    t = parent.targets[0]
    if isinstance(t, (ast.Tuple, ast.List)) and isinstance(value, ast.Name):
        named = [e for e in t.elts if isinstance(e, ast.Name) and e.id == value.id]
        if len(named) != 1 or any(isinstance(e, ast.Starred) for e in t.elts):
            return None
        t = named[0]
    label = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
    if "loader" not in label.lower() or not isinstance(t, (ast.Name, ast.Attribute)):
        return None
    return m.source(t)


def _holder_name(m, node: ast.AST) -> Optional[str]:
    """``name = Batches(...)`` of a class that iterates the one DataLoader it holds
    (:class:`dp2ddp.model.held_loaders.HeldLoader`): ``name.<attribute>``, the loader to shard."""
    held = held_loader(m, node)
    if held is None:
        return None
    parent = m.parent(node)
    if not (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1):
        return None
    t = parent.targets[0]
    if not isinstance(t, (ast.Name, ast.Attribute)):
        return None
    return f"{m.source(t)}.{held.attribute}"


def _wraps(m, node: ast.AST, feeds: set) -> bool:
    """A call whose first argument is (among other things) one of ``feeds``."""
    from dp2ddp.model.flow import origins

    if not isinstance(node, ast.Call) or not node.args or isinstance(node.args[0], ast.Starred):
        return False
    return any(id(n) in feeds for n, _ in origins(m, node.args[0]))


def _all_known(m, got, known) -> bool:
    """Every origin in ``got`` is a loader value already planned (itself, or the whole of it),
    and none an evaluation loader this migration keeps whole on every rank (a list of its
    batches, or a wrapper of it, fed to training would train every rank on all of it)."""
    evaluation = {id(ld.call) for ld in loaders(m) if not ld.training}
    return (bool(got) and all((id(n), p) in known or (id(n), ()) in known for n, p in got)
            and not any(id(n) in evaluation for n, _ in got))


def _wraps_known(m, node: ast.AST, known: set) -> bool:
    """``inf_loop(loader)``: a call whose first argument is only sharded loaders."""
    from dp2ddp.model.flow import origins

    if not isinstance(node, ast.Call) or not node.args or isinstance(node.args[0], ast.Starred):
        return False
    got = origins(m, node.args[0])
    return _all_known(m, got, known)


def _collects_known(m, node: ast.AST, known: set) -> bool:
    """``[batch for batch in train_dataloader]`` (SpanBERT's list of batches, shuffled by the
    script each epoch): a comprehension over sharded loaders only, one ``for`` and no ``if``,
    which holds one element per batch of the loader: under DDP, this rank's share of every
    batch, in the loader's order. (A filter could keep other batches on each rank: not one.)"""
    from dp2ddp.model.flow import origins

    if not isinstance(node, (ast.ListComp, ast.GeneratorExp)) or len(node.generators) != 1:
        return False
    gen = node.generators[0]
    return not gen.ifs and not gen.is_async and _all_known(m, origins(m, gen.iter), known)


def _yields_known(m, node: ast.AST, known: set) -> bool:
    """A generator of the script (``sample_data(...)``) that yields only batches of sharded
    loaders."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.training_feeds import yielded_values

    values = yielded_values(m, node)
    got = [o for v in values for o in origins(m, v)]
    return _all_known(m, got, known)


def _partly_distributed(m, loader: Loader) -> bool:
    """``sampler=train_sampler`` where the name holds a DistributedSampler on one path only
    (``DistributedSampler(ds) if args.distributed else None``): on the path that runs
    without that flag nothing shards the loader (``shard_loader`` leaves a DistributedSampler
    as it is at run time)."""
    return any(not m.call_is(v, DISTRIBUTED_SAMPLER) for v in sampler_values(m, loader.sampler_value))


def _divide_once(ctx: Context, label: str, loader_call: ast.Call, grown: ast.AST, divided: Dict[str, ast.stmt],
                 out: List[Finding]) -> bool:
    """DDP172 for ``grown`` (the batch a mixed script's own-path loader made by
    ``loader_call`` reads per process), once per value; DDP152 where it cannot be divided
    (then True: the loader is refused)."""
    m = ctx.m
    division = division_site(m, loader_call, grown, lambda n: _conditional(m, n, _switches(ctx)))
    if not isinstance(division, str) and divided.get(m.source(grown), division.init) is not division.init:
        division = f"it is divided after another start of a process group already (line {divided[m.source(grown)].lineno})"
    if isinstance(division, str):
        out.append(ctx.block(grown, "DDP152", f"{label} reads `batch_size={m.source(grown)}` per process on the "
                             "script's own distributed path, which does not divide it by the world size on every path that runs under torchrun, "
                             f"and dp2ddp cannot divide it there ({division}): under "
                             "torchrun the global batch would be world-size times the DataParallel run's; divide "
                             "it where the process group starts, or pass --keep-batch-size to accept it"))
        return True
    if m.source(grown) not in divided:
        divided[m.source(grown)] = division.init
        out.append(_divide(ctx, label, grown, division))
    return False


def _batch_never_divided(m, value: Optional[ast.AST], on: Dict[int, str]) -> Optional[ast.AST]:
    """The batch size ``value`` of a mixed script's DistributedSampler loader (``args.batch_size``)
    when no statement of the script scales that value on every path of its function: HF's
    ``train_batch_size = per_gpu_train_batch_size * max(1, n_gpu)`` is the script's own
    answer; imagenet's ``args.batch_size = int(args.batch_size / ngpus_per_node)`` under
    ``if args.gpu is not None:`` is not (torchrun leaves ``--gpu`` unset); nor is a division
    by anything but a count of processes or GPUs (BERT-NER's ``args.train_batch_size //
    args.gradient_accumulation_steps`` is still the global batch of a micro-step)."""
    if value is None or not isinstance(value, (ast.Name, ast.Attribute)):
        return None
    text = m.source(value)
    for node in m.nodes(ast.Assign, ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(m.source(t) == text for t in targets):
            continue
        if _conditional(m, node, on):
            continue  # scaled on one path only (imagenet's `if args.gpu is not None:`): not proven
        if (isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mult))
                and _counts_processes(node.value)):
            return None
        if isinstance(node, ast.Assign) and any(isinstance(b, ast.BinOp) and isinstance(b.op, (ast.Div, ast.FloorDiv, ast.Mult))
                                                and _counts_processes(b) for b in ast.walk(node.value)):
            return None
    return value


# a count per machine, or the list of devices a count is taken of (``len(args.gpu_ids)``)
_PER_NODE = re.compile(r"gpus?_per_node$|nprocs?$|nproc_per_node$|gpu_?ids$", re.IGNORECASE)


def _counts_processes(e: ast.AST) -> bool:
    """``e`` reads a count of processes or GPUs (``n_gpu``, ``ngpus_per_node``,
    ``dist.get_world_size()``, ``len(args.gpu_ids)``; the GPU-count words of
    :data:`dp2ddp.model.dp_idioms.GPU_COUNT`): a scaling of the batch by them."""
    return any(GPU_COUNT.search(i) or _PER_NODE.search(i) for i in identifiers_in(e))


def _divide(ctx: Context, label: str, value: ast.AST, division: Division) -> Finding:
    """DDP172: ``value`` divided by the world size right after the process group starts,
    under torchrun only; the script's own scalings on paths of their own are kept off there."""
    m = ctx.m
    os_, dist = ctx.name("os"), ctx.name("dist")
    text = m.source(value)
    block = ctx.stmt(
        'if "LOCAL_RANK" in {os}.environ:  # dp2ddp: DataParallel split this batch across the GPUs; each process takes its share\n'
        "    if {t} % {d}.get_world_size():\n"
        '        raise SystemExit(f"dp2ddp: batch size {{{t}}} does not split evenly between {{{d}.get_world_size()}} processes; '
        'pass a multiple of the number of processes (DataParallel read it as the global batch)")\n'
        "    {t} //= {d}.get_world_size()\n", os=os_, t=text, d=dist)
    edits: list = [InsertAfter(ctx.bridge.statement(division.init), (block,))]
    for stmt in division.scalings:
        edits.append(Guard((ctx.bridge.statement(stmt),), ctx.expr('"LOCAL_RANK" not in {os}.environ', os=os_)))
    kept = "".join(f"; its own scaling at line {s.lineno} is kept off under torchrun (the value is divided once)" for s in division.scalings)
    return ctx.note(value, "DDP172", f"{label} reads `batch_size={text}` per process on the script's own distributed path: under "
                    f"torchrun it is divided by the world size where the process group starts (line {division.init.lineno}), so the "
                    f"global batch stays the DataParallel run's{kept}", edits)


def _switches(ctx: Context) -> Dict[int, str]:
    """The tests that switch a mixed script's distributed path on (``if args.distributed:``,
    and tests spelled the same), by id, with the branch that runs under torchrun
    (:func:`dp2ddp.model.own_path.switch_tests` of mixed.detect_mode's plan)."""
    from dp2ddp.model.own_path import switch_tests

    try:
        plan = ctx.need(MixedPlan)
    except Exception:  # noqa: BLE001 - a plain script has no plan
        return {}
    return {id(t): b for t, b in switch_tests(ctx.m, plan.predicates + plan.env_switched)}


def _on_some_paths(m, stmt: ast.AST) -> bool:
    """``stmt`` runs only on some paths of its function (under an ``if`` other than the
    ``__main__`` guard, in a ``try``)."""
    return any(isinstance(a, ast.Try) or (isinstance(a, ast.If) and where != "test" and not is_main_test(a.test))
               for a, where in m.branches(stmt))


def _conditional(m, node: ast.AST, on: Dict[int, str]) -> bool:
    """``node`` sits under an ``if`` (or a ``try``, a conditional expression) of its
    function that is not the switch of the distributed path (on in its torchrun branch):
    it does not run on every path there."""
    for a, where in m.branches(node):
        if isinstance(a, ast.If):
            if is_main_test(a.test) and m.parent(a) is m.tree:
                continue  # the ``__main__`` guard: the script that runs
            if where != "test" and on.get(id(a.test)) != where:
                return True
        elif isinstance(a, ast.Try) or (isinstance(a, ast.IfExp) and where != "test"):
            return True
    return False


def _cannot_shard(m, loader: Loader, keep_batch_size: bool = False) -> Optional[str]:
    """Why ``shard_loader`` would fail on this loader, where that can be seen here. An
    ``IterableDataset`` with a batch size is sharded (``ShardedStream``: each rank keeps its
    slice of every batch of the stream); its batches cannot be dealt whole in turn."""
    batch = loader.batch_size  # the keyword or the second positional argument
    if isinstance(batch, ast.Constant) and batch.value is None:
        if loader.iterable_dataset:
            return ("reads an IterableDataset with batch_size=None (no batches to split between the ranks): give it a "
                    "batch_size, or shard the stream by rank in the dataset's __iter__ by hand")
        return "has batch_size=None (no batches to split between the ranks): shard its sampler by hand"
    if loader.iterable_dataset and keep_batch_size:
        return ("reads an IterableDataset: --keep-batch-size cannot deal its batches to the ranks in turn (their number "
                "is unknown); migrate without it (each rank takes its slice of every batch) or shard the stream by hand")
    return None


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
