from __future__ import annotations

from typing import Iterable


from dp2ddp.analysis import DDP_NAMES, Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import DDP_CODE, Refs, calls_to, Rule, assigned_names, positional, scope_key, spelled

CONVERT = frozenset(
    {
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        "torch.nn.modules.SyncBatchNorm.convert_sync_batchnorm",
        "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm",
    }
)


class SyncBatchNormAfterWrap(Rule):
    code = "DDP012"
    name = "sync-batchnorm-after-ddp-wrap"
    message = "`convert_sync_batchnorm` after the model was wrapped in `DistributedDataParallel`; convert first"
    what = (
        "Checks for `SyncBatchNorm.convert_sync_batchnorm(model)` applied to a model that is already a "
        "`DistributedDataParallel` (its result, or the same variable after the wrap)."
    )
    why = (
        "DDP registers the module's parameters and buffers when it is constructed. Converting afterwards "
        "replaces the BatchNorm layers behind DDP's back: the new SyncBatchNorm parameters are not the ones "
        "DDP reduces gradients for, so training silently diverges across ranks (or fails on unused parameters)."
    )
    fix_doc = "Convert before wrapping: `model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(model), device_ids=[local_rank])`."
    needs = (DDP_CODE, Refs(CONVERT, called=True), Refs(DDP_NAMES, called=True))
    # the wraps it compares with are in the same function (or module level) as the conversion
    keep = (calls_to(CONVERT),)
    invalid = (
        "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = DDP(model, device_ids=[rank])\nmodel = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
    )
    valid = (
        "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model, device_ids=[rank])\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        wraps = {}
        for call in an.calls(DDP_NAMES):
            for name in assigned_names(an, call):
                wraps.setdefault((scope_key(an, call), name), []).append(an.position(call))
        out = []
        for call in an.calls(CONVERT):
            args = positional(call)
            if not args:
                continue
            arg = args[0].value
            if an.call_is(arg, DDP_NAMES):
                out.append(self.finding(call))
                continue
            name = spelled(arg)
            positions = wraps.get((scope_key(an, call), name), [])
            here = an.position(call)
            if any(p < here for p in positions):
                out.append(self.finding(call))
        return out
