"""DDP008: `init_process_group` without `destroy_process_group`."""

from __future__ import annotations

from dp2ddp.model.names import DESTROY, INIT
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, components


def check(m):
    inits = m.calls(INIT)
    if inits and not m.mentions(DESTROY):
        for call in inits:
            yield Hit(call)


RULE = Rule(
    code="DDP008",
    name="process-group-never-destroyed",
    message="`init_process_group` without `destroy_process_group` in this module",
    what="Checks for modules that call `init_process_group` and never refer to `destroy_process_group`.",
    why=(
        "Without an explicit teardown the NCCL communicators are destroyed at interpreter exit, in no defined "
        "order: recent PyTorch versions warn about it, and jobs can hang at exit or leak resources, which "
        "matters when several jobs run in one allocation."
    ),
    fix=(
        "Call `dist.destroy_process_group()` at the end of the training function (in a `finally:`), or "
        "register it once: `atexit.register(dist.destroy_process_group)`."
    ),
    fix_safety="",
    gate=components(INIT),
    check=check,
    examples=(
        Invalid("import torch.distributed as dist\n\ndef main():\n    dist.init_process_group(\"nccl\")\n    train()\n", 4, 5, end=(4, 36)),
        Valid(
            "import torch.distributed as dist\n\ndef main():\n    dist.init_process_group(\"nccl\")\n    try:\n        train()\n"
            "    finally:\n        dist.destroy_process_group()\n"
        ),
        Valid(
            "import atexit\n\nimport torch.distributed as dist\n\ndist.init_process_group(\"gloo\")\n"
            "atexit.register(dist.destroy_process_group)\n"
        ),
    ),
)
