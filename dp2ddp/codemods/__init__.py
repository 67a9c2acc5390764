"""The migration, one transform per module.

Each transform is a function ``propose(ctx) -> list[Finding]``: it reads the module
through the semantic model (``ctx.m``) and proposes findings whose fixes hold edits
against LibCST nodes (found through ``ctx.bridge``). The engine (:mod:`dp2ddp.engine`)
applies all of them at once. Order matters only for shared facts: ``distributed_sampler``
records the training loaders that ``set_epoch`` then follows; ``mixed`` (run first, by
:func:`dp2ddp.migrate.plan`) decides whether the script has its own distributed path.
"""

from __future__ import annotations

from typing import Callable, List

from dp2ddp.codemods import (
    cuda_devices,
    distributed_sampler,
    dp_idioms,
    functional_dp,
    guarded_forward,
    hand_batches,
    loss_scale,
    map_location,
    mixed,
    no_sync,
    process_group,
    rank_writers,
    rank_zero,
    set_epoch,
    wrap_ddp,
)

TRANSFORMS: List[Callable] = [
    wrap_ddp.propose,
    functional_dp.propose,
    mixed.propose,
    process_group.propose,
    distributed_sampler.propose,
    set_epoch.propose,
    rank_writers.propose,
    rank_zero.propose,
    cuda_devices.propose,
    map_location.propose,
    guarded_forward.propose,
    loss_scale.propose,
    dp_idioms.propose,
    no_sync.propose,
    hand_batches.propose,
]
