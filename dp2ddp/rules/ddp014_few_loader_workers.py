from __future__ import annotations

from typing import Iterable

import libcst as cst

from dp2ddp.analysis import DATALOADER_NAMES, Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import DDP_CODE, DDP_CONTEXT, Keep, Refs, Text, Rule, has_star_kwargs, is_ddp_code, kwarg


class FewLoaderWorkers(Rule):
    code = "DDP014"
    name = "dataloader-without-workers"
    message = "`DataLoader` with {n} in a DDP script: data loading runs in the training process"
    what = (
        "In DDP code, checks for a `DataLoader` with `num_workers=0` or `1`, or without `num_workers` (the "
        "default is 0). Off by default: select it with `--select DDP014`."
    )
    why = (
        "With 0 workers every rank decodes and augments its batches in the training loop, so the GPU waits "
        "for the CPU; with DDP there are N such processes competing. It is the most common reason a DDP job "
        "is not faster than expected."
    )
    fix_doc = "Pass `num_workers=` a few per process (e.g. `os.cpu_count() // local_world_size`) and `pin_memory=True`."
    default = False
    needs = (DDP_CODE, Refs(DATALOADER_NAMES))
    keep = (Keep(Text(refs=DATALOADER_NAMES)), DDP_CONTEXT)
    invalid = (
        "import torch.distributed as dist\nfrom torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)\n",
        "import torch.distributed as dist\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(ds, batch_size=32, num_workers=1)\n",
    )
    valid = (
        "import torch.distributed as dist\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(ds, batch_size=32, num_workers=4, pin_memory=True)\n",
        "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        out = []
        for call in an.calls(DATALOADER_NAMES):
            arg = kwarg(call, "num_workers")
            if arg is None:
                if has_star_kwargs(call) or len([a for a in call.args if a.keyword is None]) >= 11:
                    continue
                out.append(self.finding(call, self.message.format(n="the default `num_workers=0`")))
            elif isinstance(arg.value, cst.Integer) and arg.value.evaluated_value in (0, 1):
                out.append(self.finding(arg, self.message.format(n=f"`num_workers={arg.value.value}`")))
        return out
