from __future__ import annotations

from typing import Iterable

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import DDP_CODE, DDP_CONTEXT, Refs, calls_to, Rule, is_ddp_code, rank_guarded

SAVE = frozenset({"torch.save", "torch.serialization.save"})


class UnguardedSave(Rule):
    code = "DDP004"
    name = "checkpoint-saved-on-every-rank"
    message = "`torch.save` runs on every rank; guard it with `if rank == 0:`"
    what = (
        "In DDP code, checks for `torch.save` calls that every rank executes: not inside an `if` on the rank, "
        "not after an `if rank != 0: return`, and not in a function this module only calls from such places."
    )
    why = (
        "Every process writes the same file at the same time: the writes race, the checkpoint can end up "
        "truncated or corrupt, and on shared storage N ranks multiply the I/O."
    )
    fix_doc = (
        "Save from one process: `if dist.get_rank() == 0: torch.save(...)`, and save "
        "`model.module.state_dict()` so that the checkpoint loads without DDP. Call `dist.barrier()` "
        "(outside the `if`) before other ranks read the file."
    )
    needs = (DDP_CODE, Refs(SAVE, called=True))
    # rank_guarded looks at the call sites of the enclosing function (and theirs)
    keep = (calls_to(SAVE), DDP_CONTEXT)
    keep_callers = True
    invalid = (
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\n"
        "for epoch in range(10):\n    train(epoch)\n    torch.save(model.module.state_dict(), \"ckpt.pt\")\n",
        "import torch\nimport torch.distributed as dist\n\n"
        "def save(model):\n    torch.save(model.state_dict(), \"m.pt\")\n\ndef main():\n    dist.init_process_group(\"gloo\")\n    save(model)\n",
    )
    valid = (
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\n"
        "for epoch in range(10):\n    train(epoch)\n    if dist.get_rank() == 0:\n        torch.save(model.module.state_dict(), \"ckpt.pt\")\n",
        "import torch\nimport torch.distributed as dist\n\n"
        "def save(model, rank):\n    if rank != 0:\n        return\n    torch.save(model.state_dict(), \"m.pt\")\n",
        "import torch\nimport torch.distributed as dist\n\n"
        "def save(model):\n    torch.save(model.state_dict(), \"m.pt\")\n\ndef main(args):\n    dist.init_process_group(\"gloo\")\n"
        "    if args.local_rank == 0:\n        save(model)\n",
        "import torch\n\ntorch.save(model.state_dict(), \"m.pt\")  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        return [self.finding(c) for c in an.calls(SAVE) if not rank_guarded(an, c)]
