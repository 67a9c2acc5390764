"""Why a training loader cannot be shared out sample by sample (:mod:`shard_loaders` refuses
it with DDP105, or points at ``--keep-batch-size``): its collate_fn cuts groups of batches, its
batch size sizes another object or is compared with a batch's own size, the step reshapes the
batch by fixed sizes, ``batch_size=None``, or a ``DistributedSampler`` on one path only.
Each returns the reason's text, or None."""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.batch_shapes import fixed_reshapes
from dp2ddp.model.flow import origins
from dp2ddp.model.loaders import Loader, grouped_batches, sampler_values
from dp2ddp.model.names import DISTRIBUTED_SAMPLER


# why a loader an evaluation loop also reads is not sharded (evaluated_apart)
EVALUATED_TOO = ("sharding it would shard that evaluation too (each rank's own metric; an early stop or a best-model "
                  "choice that differs between the ranks stops one of them in a collective)")


def groups_of_batches(m, loader: Loader) -> Optional[str]:
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


def sized_by_the_batch(m, loader: Loader) -> Optional[str]:
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


def size_tested(m, loader: Loader) -> Optional[str]:
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


def reshaped_whole(m, loader: Loader) -> Optional[str]:
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


def partly_distributed(m, loader: Loader) -> bool:
    """``sampler=train_sampler`` where the name holds a DistributedSampler on one path only
    (``DistributedSampler(ds) if args.distributed else None``): on the path that runs
    without that flag nothing shards the loader (``shard_loader`` leaves a DistributedSampler
    as it is at run time)."""
    return any(not m.call_is(v, DISTRIBUTED_SAMPLER) for v in sampler_values(m, loader.sampler_value))


def cannot_shard(m, loader: Loader, keep_batch_size: bool = False) -> Optional[str]:
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
