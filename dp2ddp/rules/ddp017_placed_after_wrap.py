"""DDP017: the module is placed on its device after the `DistributedDataParallel` wrap."""

from __future__ import annotations

import ast

from dp2ddp.model.collectives import outer_chain
from dp2ddp.model.names import DDP
from dp2ddp.model.placement import placed_before, placed_in, placements_after
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, positional, tails


def check(m):
    for call in m.calls(DDP):
        args = positional(call)
        module = args[0] if args else None
        if module is None or placed_in(m, module):
            continue  # DDP(model.cuda()): placed where it is wrapped
        stmt = m.statement_of(outer_chain(m, call))
        if stmt is None:
            continue
        names = {m.source(module)}
        targets = getattr(stmt, "targets", None) or []
        names |= {m.source(t) for t in targets}
        if placed_before(m, stmt, {m.source(module)}):
            continue  # already on its device when wrapped; a later .to() changes nothing
        for late in placements_after(m, stmt, names):
            yield Hit(late.value if isinstance(late, (ast.Expr, ast.Assign)) else late)
            break


_HEAD = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"

RULE = Rule(
    code="DDP017",
    name="module-placed-after-ddp-wrap",
    message="the module is moved to its device after the `DistributedDataParallel` wrap; place it first",
    what=(
        "Checks for `DistributedDataParallel(model, ...)` whose module was not placed on a device before the wrap "
        "and is placed after it (`model.cuda()`, `model.to(device)`, on the module or on the wrapper)."
    ),
    why=(
        "DDP needs the module's parameters on `device_ids[0]` when it is built: it checks them and broadcasts rank "
        "0's values from there. Placed afterwards, the script runs on CPU (gloo) and fails on the first GPU run "
        "(\"DistributedDataParallel's input module must be on the same type of devices\" or parameters on the wrong "
        "device). A DataParallel wrap that was moved out of `if ngpu > 1:` above a separate `if ngpu > 0: net.cuda()` "
        "ends up like this."
    ),
    fix="Move the placement above the wrap: `model = DDP(model.to(device), device_ids=[local_rank])`.",
    fix_safety="",
    gate=(tails(DDP),),
    check=check,
    examples=(
        Invalid(_HEAD + "net = DDP(net, device_ids=[0])\nnet.cuda()\n", 5, 1, end=(5, 11)),
        Valid(_HEAD + "net = net.cuda()\nnet = DDP(net, device_ids=[0])\nnet.to(\"cuda\")\n"),
        Valid(_HEAD + "net = DDP(net.cuda(), device_ids=[0])\n"),
        Valid(_HEAD + "net = DDP(net.cuda() if torch.cuda.is_available() else net, device_ids=[0])\nnet.cuda()\n"),
        Valid(_HEAD + "net = DDP(net)\n"),
    ),
)
