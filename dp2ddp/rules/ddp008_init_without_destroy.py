from __future__ import annotations

from typing import Iterable


from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import DDP_CODE, Keep, Refs, Shape, Text, calls_to, Rule, all_qnames

INIT = frozenset({"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"})
DESTROY = frozenset(
    {"torch.distributed.destroy_process_group", "torch.distributed.distributed_c10d.destroy_process_group"}
)


class InitWithoutDestroy(Rule):
    code = "DDP008"
    name = "process-group-never-destroyed"
    message = "`init_process_group` without `destroy_process_group` in this module"
    what = "Checks for modules that call `init_process_group` and never refer to `destroy_process_group`."
    why = (
        "Without an explicit teardown the NCCL communicators are destroyed at interpreter exit, in no defined "
        "order: recent PyTorch versions warn about it, and jobs can hang at exit or leak resources, which "
        "matters when several jobs run in one allocation."
    )
    fix_doc = (
        "Call `dist.destroy_process_group()` at the end of the training function (in a `finally:`), or "
        "register it once: `atexit.register(dist.destroy_process_group)`."
    )
    # a module that certainly refers to destroy_process_group is silent (an exact test: the
    # shape may only say "no finding" when there is none)
    needs = (DDP_CODE, Refs(INIT, called=True), Shape(lambda ix: not ix.facts.definite(DESTROY), "init_process_group"))
    keep = (calls_to(INIT), Keep(Text(refs=DESTROY)))
    invalid = ("import torch.distributed as dist\n\ndef main():\n    dist.init_process_group(\"nccl\")\n    train()\n",)
    valid = (
        "import torch.distributed as dist\n\ndef main():\n    dist.init_process_group(\"nccl\")\n    try:\n        train()\n"
        "    finally:\n        dist.destroy_process_group()\n",
        "import atexit\n\nimport torch.distributed as dist\n\ndist.init_process_group(\"gloo\")\n"
        "atexit.register(dist.destroy_process_group)\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        inits = an.calls(INIT)
        if not inits or all_qnames(an) & DESTROY:
            return []
        return [self.finding(c) for c in inits]
