"""DDP020: `DistributedDataParallel` wraps a module that has no parameters."""

from __future__ import annotations

from dp2ddp.model.kinds import without_parameters
from dp2ddp.model.names import DDP
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, positional, tails


def check(m):
    for call in m.calls(DDP):
        args = positional(call)
        if args and without_parameters(m, args[0]):
            yield Hit(call)


_HEAD = "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"

RULE = Rule(
    code="DDP020",
    name="ddp-without-parameters",
    message="`DistributedDataParallel` of a module with no parameters raises when it is built; use the module bare",
    what=(
        "Checks for `DistributedDataParallel(m)` where every value `m` may hold is a `torch.nn` module that has no "
        "parameters: a loss (`nn.CrossEntropyLoss()`), an activation, a pooling or dropout layer."
    ),
    why=(
        "DDP exists to all-reduce gradients; built over a module without parameters it raises \"DistributedDataParallel "
        "is not needed when a module doesn't have any parameter that requires a gradient\". Scripts that wrapped their "
        "criterion in `DataParallel` (to spread the loss computation over the GPUs) meet this when the wrap is "
        "replaced one for one. Under DDP each process already computes the loss of its own share of the batch."
    ),
    fix="Drop the wrap: `criterion = nn.CrossEntropyLoss().to(device)`.",
    fix_safety="",
    gate=(tails(DDP),),
    check=check,
    examples=(
        Invalid(_HEAD + "criterion = DDP(nn.CrossEntropyLoss())\n", 4, 13, end=(4, 39)),
        Invalid(_HEAD + "crit = nn.MSELoss().cuda()\ncrit = DDP(crit, device_ids=[0])\n", 5, 8, end=(5, 33)),
        Valid(_HEAD + "net = DDP(nn.Linear(2, 2))\n"),
        Valid(_HEAD + "crit = nn.MSELoss() if plain else nn.Linear(2, 2)\ncrit = DDP(crit)\n"),
        Valid(_HEAD + "crit = DDP(make_loss())\n"),
        Valid(_HEAD + "net = build()\nnet.encoder = DDP(net.encoder)\n"),
    ),
)
