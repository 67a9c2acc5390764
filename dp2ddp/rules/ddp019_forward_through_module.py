"""DDP019: a training loss computed by a forward through `.module` of a DDP wrapper."""

from __future__ import annotations

from dp2ddp.model.collectives import wrapped_vars
from dp2ddp.model.module_bypass import bypassing_forwards
from dp2ddp.model.names import DDP
from dp2ddp.model.uses import wrapper_keys
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, tails


def check(m):
    seeds = wrapped_vars(m)
    if not seeds:
        return
    for b in bypassing_forwards(m, wrapper_keys(m, seeds)):
        yield Hit(b.call)


_HEAD = (
    "import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
    "dist.init_process_group(\"gloo\")\nmodel = DDP(Net())\n"
)

RULE = Rule(
    code="DDP019",
    name="training-forward-through-module",
    message="the loss comes from a forward through `.module`, around the DDP wrapper: its gradients are not averaged",
    what=(
        "Checks for a backward pass whose loss is computed by `model.module(x)` or a method of the model called "
        "through `.module` (`model.module.compute_loss(x, y)`), where `model` holds a `DistributedDataParallel` "
        "wrapper, outside `torch.no_grad()`. The loss is followed through the names it is computed from in its "
        "function (`dp2ddp.model.module_bypass`, the fact the migration's DDP167 reads too)."
    ),
    why=(
        "DDP averages gradients over the ranks only after a forward through the wrapper itself: its `forward` readies "
        "the reducer for the backward pass. Through `.module`, every rank keeps the gradients of its own batch, the "
        "optimizers step apart and the replicas drift, with no error. Under DataParallel the same call only ran on "
        "one GPU, so scripts migrated by hand keep it."
    ),
    fix=(
        "Call the wrapper: `model(x)`. A method that computes the loss can become the model's `forward` (or the "
        "`forward` of a small module that holds the model and calls it), so that the wrapper runs it."
    ),
    fix_safety="",
    gate=(tails(DDP), ("module",)),
    check=check,
    examples=(
        Invalid(_HEAD + "loss = model.module.compute_loss(x, y)\nloss.backward()\n", 7, 8, end=(7, 39)),
        Invalid(_HEAD + "out = model.module(x)\nloss = (out - y).pow(2).mean()\nloss.backward()\n", 7, 7, end=(7, 22)),
        Valid(_HEAD + "loss = model(x).sum()\nloss.backward()\n"),
        Valid(_HEAD + "with torch.no_grad():\n    ref = model.module(x)\nloss = (model(x) - ref).pow(2).mean()\n"
              "loss.backward()\n"),
        Valid(_HEAD + "loss = model(x).sum()\nloss.backward()\nmodel.module.log_stats()\n"),
    ),
)
