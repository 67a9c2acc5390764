"""The migration, one transform per module.

Each transform is a function ``propose(ctx) -> list[Finding]``: it reads the module
through the semantic model (``ctx.m``) and proposes findings whose fixes hold edits
against LibCST nodes (found through ``ctx.bridge``). The engine (:mod:`dp2ddp.engine`)
applies all of them at once. Order matters only for shared facts: ``shard_loaders``
records the loaders a script's own ``DistributedSampler`` shards, whose epoch loops
``set_epoch`` then follows; ``mixed`` (run first, by
:func:`dp2ddp.migrate.plan`) decides whether the script has its own distributed path.
"""

from __future__ import annotations

from typing import Callable, List

from dp2ddp.codemods import (
    cuda_devices,
    dp_idioms,
    functional_dp,
    guarded_forward,
    loss_scale,
    map_location,
    mixed,
    process_group,
    rank_writers,
    rank_zero,
    set_epoch,
    shard_loaders,
    wrap_ddp,
)

TRANSFORMS: List[Callable] = [
    wrap_ddp.propose,
    functional_dp.propose,
    mixed.propose,
    process_group.propose,
    shard_loaders.propose,
    set_epoch.propose,
    rank_writers.propose,
    rank_zero.propose,
    cuda_devices.propose,
    map_location.propose,
    guarded_forward.propose,
    loss_scale.propose,
    dp_idioms.propose,
]
