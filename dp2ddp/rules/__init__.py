"""The lint rules of `dp2ddp check`: one module per rule, each defining ``RULE``.

``RULES`` lists them in code order; :mod:`dp2ddp.registry` joins them with the
migration's codes (DDP1xx) into the one registry of every code the tool prints.
"""

from __future__ import annotations

from typing import Dict, List

from dp2ddp.rules import (
    ddp001_data_parallel,
    ddp002_sampler_set_epoch,
    ddp003_sampler_with_shuffle,
    ddp004_unguarded_save,
    ddp005_load_without_map_location,
    ddp006_bare_cuda,
    ddp007_ddp_without_device_ids,
    ddp008_init_without_destroy,
    ddp009_collective_in_rank_branch,
    ddp010_dp_loss_mean,
    ddp011_local_rank_argparse,
    ddp012_sync_batchnorm_after_wrap,
    ddp013_batchnorm_without_sync,
    ddp014_few_loader_workers,
    ddp015_sum_reduction,
    ddp017_placed_after_wrap,
)
from dp2ddp.rules.base import Rule

# every module of this package that defines a rule, in code order
RULES: List[Rule] = [
    module.RULE
    for name, module in sorted(globals().items())
    if name.startswith("ddp0") and hasattr(module, "RULE")
]

BY_CODE: Dict[str, Rule] = {r.code: r for r in RULES}
BY_NAME: Dict[str, Rule] = {r.name: r for r in RULES}


def select_rules(select=None, ignore=None, extend_select=None) -> List[Rule]:
    """The active lint rules for a selection (see :func:`dp2ddp.registry.select`)."""
    from dp2ddp.registry import select as _select

    codes = set(_select(select, ignore, extend_select))
    return [r for r in RULES if r.code in codes]


__all__ = ["RULES", "BY_CODE", "BY_NAME", "Rule", "select_rules"]
