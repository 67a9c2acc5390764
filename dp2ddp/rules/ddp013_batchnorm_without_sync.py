from __future__ import annotations

from typing import Iterable

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import DDP_CODE, DDP_CONTEXT, Keep, Refs, Text, Rule, all_qnames, is_ddp_code

BATCHNORM = frozenset(
    f"{mod}.{cls}"
    for mod in ("torch.nn", "torch.nn.modules", "torch.nn.modules.batchnorm")
    for cls in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")
)
SYNC = frozenset(
    {"torch.nn.SyncBatchNorm", "torch.nn.modules.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm"}
)


class BatchNormWithoutSync(Rule):
    code = "DDP013"
    name = "batchnorm-without-syncbatchnorm"
    message = "BatchNorm in DDP code without `SyncBatchNorm`: statistics are computed per rank (per-GPU batch)"
    what = (
        "In DDP code that never mentions `SyncBatchNorm`, reports `BatchNorm1d/2d/3d` layers. Informational and "
        "off by default: select it with `--select DDP013`."
    )
    why = (
        "Each rank normalises with the mean and variance of its own per-GPU batch. With small per-GPU batches "
        "(detection, segmentation) the statistics are noisy and accuracy drops compared to the large "
        "single-process batch. For large per-GPU batches this is harmless and faster, which is why the rule "
        "is informational."
    )
    fix_doc = "If per-GPU batches are small, convert before wrapping: `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`."
    default = False
    severity = "info"
    needs = (DDP_CODE, Refs(BATCHNORM))
    keep = (Keep(Text(refs=BATCHNORM)), Keep(Text(refs=SYNC, prefix=True)), DDP_CONTEXT)
    invalid = ("import torch.distributed as dist\nimport torch.nn as nn\n\nlayer = nn.BatchNorm2d(64)\n",)
    valid = (
        "import torch.distributed as dist\nimport torch.nn as nn\n\nlayer = nn.BatchNorm2d(64)\n"
        "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
        "import torch.nn as nn\n\nlayer = nn.BatchNorm2d(64)  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        qn = all_qnames(an)
        if any(q in SYNC or q.startswith(tuple(s + "." for s in SYNC)) for q in qn):
            return []
        return [self.finding(c) for c in an.calls(BATCHNORM)]
