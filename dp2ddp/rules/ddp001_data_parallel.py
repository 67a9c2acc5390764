from __future__ import annotations

from typing import Iterable

import libcst as cst

from dp2ddp.analysis import DP_NAMES, Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import Refs, Rule


class DataParallelUsage(Rule):
    code = "DDP001"
    name = "data-parallel-usage"
    message = "`DataParallel` is used; migrate to `DistributedDataParallel`"
    what = (
        "Checks for uses of `torch.nn.DataParallel` (under any import spelling or alias: "
        "`nn.DataParallel`, `torch.nn.parallel.DataParallel`, `from torch.nn import DataParallel as DP`). "
        "`isinstance`/`issubclass` checks, which code needs to unwrap either wrapper, are not reported."
    )
    why = (
        "DataParallel runs one Python process that scatters every batch to the GPUs and gathers the outputs "
        "back on GPU 0 each step: it is bound by the GIL, overloads GPU 0, and does not scale beyond one "
        "machine. PyTorch recommends DistributedDataParallel even on a single machine."
    )
    fix_doc = (
        "Run the script under `torchrun` with one process per GPU and wrap the model in "
        "`DistributedDataParallel`. `dp2ddp check --fix` (or `dp2ddp rewrite`) performs the whole migration: "
        "process-group set-up and teardown, per-rank device, `DistributedSampler`, rank-0-only saving and logging."
    )
    fixable = True
    needs = (Refs(DP_NAMES, type_checks=False),)
    # keep = None: no pruning; the finding carries the whole-module migration fix
    invalid = (
        "import torch.nn as nn\n\nmodel = nn.DataParallel(model)\n",
        "from torch.nn import DataParallel as DP\n\nnet = DP(net, device_ids=[0, 1])\n",
        "import torch\n\nmodel = torch.nn.parallel.DataParallel(model).cuda()\n",
    )
    valid = (
        "import os\n\nimport torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "local_rank = int(os.environ[\"LOCAL_RANK\"])\nmodel = DDP(model.to(local_rank), device_ids=[local_rank])\n",
        "def DP(x):\n    return x\n\nmodel = DP(model)\n",
        "import torch.nn as nn\n\nnet = model.module if isinstance(model, nn.DataParallel) else model\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        refs = []
        for ref in an.refs(DP_NAMES):
            if _in_type_check(an, ref):
                continue
            refs.append(ref)
        if not refs:
            return []
        fix = _migration_fix(an)
        return [self.finding(ref, fix=fix) for ref in refs]


def _in_type_check(an: Analysis, node: cst.CSTNode) -> bool:
    for a in an.ancestors(node):
        if isinstance(a, cst.Call):
            return an.is_name(a.func, {"builtins.isinstance", "builtins.issubclass"})
        if isinstance(a, (cst.BaseStatement,)):
            return False
    return False


def _migration_fix(an: Analysis):
    """The DP->DDP migration is this rule's fix: one shared Fix for the whole file."""
    key = "rules:ddp001-fix"
    if key not in an.cache:
        from dp2ddp.migrate import Options, plan_migration

        migration = plan_migration(an, Options())
        an.cache[key] = migration.fix if migration.fix else None
    return an.cache[key]
