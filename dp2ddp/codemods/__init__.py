"""The migration, one transform per module.

Each transform is a function ``propose(ctx) -> list[Finding]``: it inspects the original
tree through ``ctx.an`` and proposes findings whose fixes hold the edits. The engine
(:mod:`dp2ddp.engine`) applies all of them at once. Order matters only for shared facts:
``distributed_sampler`` records the training loaders that ``set_epoch`` then follows.
"""

from __future__ import annotations

from typing import Callable, List

from dp2ddp.codemods import cuda_devices, distributed_sampler, process_group, rank_zero, set_epoch, wrap_ddp

TRANSFORMS: List[Callable] = [
    wrap_ddp.propose,
    process_group.propose,
    distributed_sampler.propose,
    set_epoch.propose,
    rank_zero.propose,
    cuda_devices.propose,
]
