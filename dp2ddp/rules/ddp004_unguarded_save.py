"""DDP004: `torch.save` on every rank."""

from __future__ import annotations

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.names import SAVE
from dp2ddp.model.rank_alike import per_process_path
from dp2ddp.model.ranks import rank_guarded
from dp2ddp.model.writers import writer_of
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, tails


def check(m):
    if not is_ddp_code(m):
        return
    for call in m.calls(SAVE):
        if rank_guarded(m, call):
            continue
        w = writer_of(m, call)
        if w is not None and per_process_path(m, w.path) is not None:
            continue  # a temporary file of this process's own: every rank writes (and reads) its own
        yield Hit(call)


_HEAD = "import torch\nimport torch.distributed as dist\n\n"

RULE = Rule(
    code="DDP004",
    name="checkpoint-saved-on-every-rank",
    message="`torch.save` runs on every rank; guard it with `if rank == 0:`",
    what=(
        "In DDP code, checks for `torch.save` calls that every rank executes: not inside an `if` (or conditional "
        "expression) on the rank, not after an `if rank != 0: return`, not in a function named for the main "
        "process (`save_on_main_process`, `*_rank0`), and not in a function this module only calls from such places. "
        "What counts as a rank test is the one definition `rewrite` uses too (`dp2ddp.model.ranks`). A save to a "
        "temporary path of the process's own (`tempfile.mkdtemp()`, `NamedTemporaryFile`) is not one: each rank "
        "writes and reads its own file."
    ),
    why=(
        "Every process writes the same file at the same time: the writes race, the checkpoint can end up "
        "truncated or corrupt, and on shared storage N ranks multiply the I/O."
    ),
    fix=(
        "Save from one process: `if dist.get_rank() == 0: torch.save(...)`, and save "
        "`model.module.state_dict()` so that the checkpoint loads without DDP. Call `dist.barrier()` "
        "(outside the `if`) before other ranks read the file."
    ),
    fix_safety="",
    gate=(DDP_CODE, tails(SAVE)),
    check=check,
    examples=(
        Invalid(
            _HEAD + "dist.init_process_group(\"nccl\")\n"
            "for epoch in range(10):\n    train(epoch)\n    torch.save(model.module.state_dict(), \"ckpt.pt\")\n",
            7, 5, end=(7, 53),
        ),
        Invalid(
            _HEAD + "def save(model):\n    torch.save(model.state_dict(), \"m.pt\")\n\ndef main():\n"
            "    dist.init_process_group(\"gloo\")\n    save(model)\n",
            5, 5, end=(5, 43),
        ),
        Valid(
            _HEAD + "dist.init_process_group(\"nccl\")\n"
            "for epoch in range(10):\n    train(epoch)\n    if dist.get_rank() == 0:\n        torch.save(model.module.state_dict(), \"ckpt.pt\")\n"
        ),
        Valid(_HEAD + "def save(model, rank):\n    if rank != 0:\n        return\n    torch.save(model.state_dict(), \"m.pt\")\n"),
        Valid(_HEAD + "import os\nimport tempfile\n\ndist.init_process_group(\"gloo\")\n"
              "path = os.path.join(tempfile.mkdtemp(), \"w.pt\")\ntorch.save(model.state_dict(), path)\n"),
        Valid(
            _HEAD + "def save(model):\n    torch.save(model.state_dict(), \"m.pt\")\n\ndef main(args):\n    dist.init_process_group(\"gloo\")\n"
            "    if args.local_rank == 0:\n        save(model)\n"
        ),
        Valid("import torch\n\ntorch.save(model.state_dict(), \"m.pt\")  # not DDP code\n"),
    ),
)
