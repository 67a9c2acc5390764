"""DDP013 (off by default): BatchNorm in DDP code without SyncBatchNorm."""

from __future__ import annotations

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.names import BATCHNORM, SYNC_BATCHNORM_ANY
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, tails

_SYNC_PREFIXES = tuple(s + "." for s in SYNC_BATCHNORM_ANY)


def _mentions_sync(m) -> bool:
    return m.mentions(SYNC_BATCHNORM_ANY) or any(q.startswith(_SYNC_PREFIXES) for q in m.import_names)


def check(m):
    if not is_ddp_code(m):
        return
    calls = m.calls(BATCHNORM)
    if calls and not _mentions_sync(m):
        for call in calls:
            yield Hit(call)


RULE = Rule(
    code="DDP013",
    name="batchnorm-without-syncbatchnorm",
    message="BatchNorm in DDP code without `SyncBatchNorm`: statistics are computed per rank (per-GPU batch)",
    what=(
        "In DDP code that never mentions `SyncBatchNorm`, reports `BatchNorm1d/2d/3d` layers. Informational and "
        "off by default: select it with `--select DDP013`."
    ),
    why=(
        "Each rank normalises with the mean and variance of its own per-GPU batch. With small per-GPU batches "
        "(detection, segmentation) the statistics are noisy and accuracy drops compared to the large "
        "single-process batch. For large per-GPU batches this is harmless and faster, which is why the rule "
        "is informational."
    ),
    fix="If per-GPU batches are small, convert before wrapping: `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`.",
    fix_safety="",
    default=False,
    severity="info",
    gate=(DDP_CODE, tails(BATCHNORM)),
    check=check,
    examples=(
        Invalid("import torch.distributed as dist\nimport torch.nn as nn\n\nlayer = nn.BatchNorm2d(64)\n", 4, 9, end=(4, 27)),
        Valid(
            "import torch.distributed as dist\nimport torch.nn as nn\n\nlayer = nn.BatchNorm2d(64)\n"
            "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        ),
        Valid("import torch.nn as nn\n\nlayer = nn.BatchNorm2d(64)  # not DDP code\n"),
    ),
)
