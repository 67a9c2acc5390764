"""DDP012: `convert_sync_batchnorm` after the DDP wrap."""

from __future__ import annotations

from dp2ddp.model.collectives import assigned_keys, outer_chain, var_key
from dp2ddp.model.names import CONVERT_SYNC_BATCHNORM, DDP
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, positional, tails


def check(m):
    converts = m.calls(CONVERT_SYNC_BATCHNORM)
    if not converts:
        return
    wraps = {}
    for call in m.calls(DDP):
        for key in assigned_keys(m, outer_chain(m, call)):
            # the wrap exists once its call returns: a conversion inside its arguments comes first
            wraps.setdefault(key, []).append(m.end_position(call))
    for call in converts:
        args = positional(call)
        if not args:
            continue
        arg = args[0]
        if m.call_is(arg, DDP):
            yield Hit(call)
            continue
        here = m.position(call)
        if any(p < here for p in wraps.get(var_key(m, arg), ())):
            yield Hit(call)


_HEAD = "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"

RULE = Rule(
    code="DDP012",
    name="sync-batchnorm-after-ddp-wrap",
    message="`convert_sync_batchnorm` after the model was wrapped in `DistributedDataParallel`; convert first",
    what=(
        "Checks for `SyncBatchNorm.convert_sync_batchnorm(model)` applied to a model that is already a "
        "`DistributedDataParallel` (its result, or the same variable after the wrap)."
    ),
    why=(
        "DDP registers the module's parameters and buffers when it is constructed. Converting afterwards "
        "replaces the BatchNorm layers behind DDP's back: the new SyncBatchNorm parameters are not the ones "
        "DDP reduces gradients for, so training silently diverges across ranks (or fails on unused parameters)."
    ),
    fix="Convert before wrapping: `model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(model), device_ids=[local_rank])`.",
    fix_safety="",
    gate=(tails(DDP), tails(CONVERT_SYNC_BATCHNORM)),
    check=check,
    examples=(
        Invalid(_HEAD + "model = DDP(model, device_ids=[rank])\nmodel = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n", 5, 9, end=(5, 55)),
        Valid(_HEAD + "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model, device_ids=[rank])\n"),
        Valid(_HEAD + "model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(model) if cuda else model, device_ids=ids)\n"),
    ),
)
