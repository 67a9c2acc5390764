"""The migration, one transform per module.

Each transform is a function ``propose(ctx) -> list[Finding]``: it reads the module
through the semantic model (``ctx.m``) and proposes findings whose fixes hold edits
against LibCST nodes (found through ``ctx.bridge``). The engine (:mod:`dp2ddp.engine`)
applies all of them at once. Transforms share facts only through typed values (:mod:`dp2ddp.codemods.facts`): a
module declares ``NEEDS``/``PROVIDES`` and the order below puts every provider first
(``wrap_ddp`` provides the wrapper variables, ``shard_loaders`` the loaders a script's own
``DistributedSampler`` shards, which ``set_epoch`` follows, and the evaluation loaders
``shard_eval`` reads; ``mixed.detect_mode``, run
before all of them by :func:`dp2ddp.migrate.plan`, provides the mixed-script plan).
"""

from __future__ import annotations

from typing import Callable, List

from dp2ddp.codemods.facts import order

from dp2ddp.codemods import (
    cuda_devices,
    dp_idioms,
    functional_dp,
    guarded_forward,
    handed_keys,
    init_forward,
    hand_batches,
    local_rank_flag,
    in_batch_loss,
    loss_scale,
    map_location,
    mixed,
    no_sync,
    process_group,
    rank_noise,
    rank_writers,
    rank_zero,
    set_epoch,
    shard_eval,
    shard_loaders,
    valid_mean,
    whole_saves,
    wrap_ddp,
)

# the written order; providers of facts are moved before the transforms that need them
# (each module's NEEDS / PROVIDES, see dp2ddp.codemods.facts)
_MODULES = [
    wrap_ddp,
    functional_dp,
    mixed,
    local_rank_flag,
    process_group,
    shard_loaders,
    shard_eval,
    set_epoch,
    whole_saves,
    init_forward,
    rank_writers,
    rank_zero,
    cuda_devices,
    map_location,
    guarded_forward,
    loss_scale,
    valid_mean,
    dp_idioms,
    handed_keys,
    no_sync,
    hand_batches,
    rank_noise,
    in_batch_loss,
]


def _ordered() -> List[Callable]:
    by_name = {m.__name__.rsplit(".", 1)[1]: m for m in _MODULES}
    # mixed.detect_mode runs before every transform (dp2ddp.migrate.plan) and provides the plan
    spec = [("detect_mode", (), (mixed.MixedPlan,))]
    spec += [(name, getattr(mod, "NEEDS", ()), getattr(mod, "PROVIDES", ())) for name, mod in by_name.items()]
    return [by_name[name].propose for name in order(spec) if name in by_name]


TRANSFORMS: List[Callable] = _ordered()
