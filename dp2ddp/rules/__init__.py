"""The lint rules of `dp2ddp check`, one module per rule, and their registry.

``RULES`` lists one instance of every rule in code order. ``select_rules`` turns
``--select``/``--ignore`` lists (codes, code prefixes or ``ALL``) into the active set.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

from dp2ddp.rules.base import Refs, Rule, Tokens
from dp2ddp.rules.ddp001_data_parallel import DataParallelUsage
from dp2ddp.rules.ddp002_sampler_set_epoch import SamplerSetEpochMissing
from dp2ddp.rules.ddp003_sampler_with_shuffle import SamplerWithShuffle
from dp2ddp.rules.ddp004_unguarded_save import UnguardedSave
from dp2ddp.rules.ddp005_load_without_map_location import LoadWithoutMapLocation
from dp2ddp.rules.ddp006_bare_cuda import BareCudaDevice
from dp2ddp.rules.ddp007_ddp_without_device_ids import DDPWithoutDeviceIds
from dp2ddp.rules.ddp008_init_without_destroy import InitWithoutDestroy
from dp2ddp.rules.ddp009_collective_in_rank_branch import CollectiveInRankBranch
from dp2ddp.rules.ddp010_dp_loss_mean import DPLossMean
from dp2ddp.rules.ddp011_local_rank_argparse import LocalRankArgparse
from dp2ddp.rules.ddp012_sync_batchnorm_after_wrap import SyncBatchNormAfterWrap
from dp2ddp.rules.ddp013_batchnorm_without_sync import BatchNormWithoutSync
from dp2ddp.rules.ddp014_few_loader_workers import FewLoaderWorkers
from dp2ddp.rules.ddp015_sum_reduction import SumReductionLoss

RULES: List[Rule] = [
    DataParallelUsage(),
    SamplerSetEpochMissing(),
    SamplerWithShuffle(),
    UnguardedSave(),
    LoadWithoutMapLocation(),
    BareCudaDevice(),
    DDPWithoutDeviceIds(),
    InitWithoutDestroy(),
    CollectiveInRankBranch(),
    DPLossMean(),
    LocalRankArgparse(),
    SyncBatchNormAfterWrap(),
    BatchNormWithoutSync(),
    FewLoaderWorkers(),
    SumReductionLoss(),
]

BY_CODE: Dict[str, Rule] = {r.code: r for r in RULES}
BY_NAME: Dict[str, Rule] = {r.name: r for r in RULES}

__all__ = ["RULES", "BY_CODE", "BY_NAME", "Rule", "Refs", "Tokens", "UnknownCode", "select_rules", "expand"]


class UnknownCode(ValueError):
    def __init__(self, code: str) -> None:
        self.code = code
        valid = ", ".join(r.code for r in RULES)
        super().__init__(f"unknown rule code {code!r}; valid codes: ALL, {valid} (or a prefix such as DDP0)")


def expand(selector: str) -> List[Rule]:
    """Rules matched by one selector: ``ALL``, a full code, a code prefix or a rule name."""
    s = selector.strip()
    if not s:
        return []
    if s.upper() == "ALL":
        return list(RULES)
    if s in BY_NAME:
        return [BY_NAME[s]]
    matched = [r for r in RULES if r.code.startswith(s.upper())]
    if not matched:
        raise UnknownCode(s)
    return matched


def split_codes(values: Iterable[str]) -> List[str]:
    out: List[str] = []
    for v in values:
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return out


def select_rules(
    select: Optional[Sequence[str]] = None,
    ignore: Optional[Sequence[str]] = None,
    extend_select: Optional[Sequence[str]] = None,
) -> List[Rule]:
    """The active rules. Without ``select``, the default rules; ``ignore`` wins over
    ``select`` unless a more specific selector re-enables a rule (ruff's precedence)."""
    chosen: Dict[str, int] = {}  # code -> specificity of the selector that decided it
    if select is None:
        for r in RULES:
            if r.default:
                chosen[r.code] = 0
    else:
        for s in split_codes(select):
            for r in expand(s):
                chosen[r.code] = len(s) if s.upper() != "ALL" else 0
    for s in split_codes(extend_select or ()):
        for r in expand(s):
            chosen[r.code] = max(chosen.get(r.code, 0), len(s))
    for s in split_codes(ignore or ()):
        spec = len(s) if s.upper() != "ALL" else 0
        for r in expand(s):
            if r.code in chosen and chosen[r.code] <= spec:
                del chosen[r.code]
    return [r for r in RULES if r.code in chosen]
