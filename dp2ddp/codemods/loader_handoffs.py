"""Where the sharded training data goes next, and the refusals (DDP105) that follow: batches
pulled from no loader, a loader trained on in a module this migration does not edit, a model
handed to project code that trains on its own data, a sharded loader also read by a
statistic loop, pickled, or handed to either of two classes."""

from __future__ import annotations

import ast
from typing import List, Tuple

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding


def pulled_batch_refusals(ctx: Context) -> List[Finding]:
    """DDP105 for a training loop over a count whose batch comes from a call that is no
    loader dp2ddp can shard (``sess.run(train_iter)``, ``get_batch()`` drawing positions at
    random): under DDP every rank would pull a whole batch of its own."""
    from dp2ddp.model.pulled_batches import pulled_batches

    m = ctx.m
    out: List[Finding] = []
    for p in pulled_batches(m):
        what = m.brief(p.source)
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


def foreign_training_refusals(ctx: Context) -> List[Finding]:
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


def read_outside_training(ctx: Context, sharded: List[Tuple[ast.Call, str]]) -> List[Finding]:
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


def handed_trainer_refusals(ctx: Context, sharded_calls: set, sharded_names: set) -> List[Finding]:
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


def pickled_loaders(ctx: Context, wrapped, rebinds) -> List[Finding]:
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


def handed_to_either_refusals(ctx: Context) -> List[Finding]:
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
