"""DDP007: `DistributedDataParallel` on CUDA without `device_ids`."""

from __future__ import annotations

import ast

from dp2ddp.model.call_args import DDP_PARAMS, argument
from dp2ddp.model.names import DDP
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, cached, has_double_star, literal, tails


def uses_cuda(m) -> bool:
    """The module puts work on CUDA: a ``.cuda`` attribute (``.cuda()``, ``torch.cuda.*``)
    or a string that starts with ``cuda`` (``"cuda:1"``, ``f"cuda:{rank}"``)."""

    def compute() -> bool:
        if any(n.attr == "cuda" for n in m.nodes(ast.Attribute)):
            return True
        in_fstrings = set()
        for j in m.nodes(ast.JoinedStr):
            parts = [v.value for v in j.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            in_fstrings.update(id(v) for v in j.values)
            if "cuda" in "".join(parts):
                return True
        return any(
            isinstance(c.value, str) and c.value.startswith("cuda") and id(c) not in in_fstrings for c in m.nodes(ast.Constant)
        )

    return cached(m, "uses-cuda", compute)


def check(m):
    calls = m.calls(DDP)
    if not calls or not uses_cuda(m):
        return
    for call in calls:
        if argument(call, DDP_PARAMS, "device_ids") is None and not has_double_star(call):
            yield Hit(call)


RULE = Rule(
    code="DDP007",
    name="ddp-without-device-ids",
    message="`DistributedDataParallel` on CUDA without `device_ids=[local_rank]`",
    what=(
        "Checks for `DistributedDataParallel(model)` without `device_ids` in a module that puts work on CUDA "
        "(`.cuda()`, `\"cuda...\"` devices, `torch.cuda.*`)."
    ),
    why=(
        "For a single-device module DDP should be told its device: with `device_ids=None` it does not move "
        "inputs to the model's device and relies on the current CUDA device being right, which is GPU 0 "
        "unless `set_device` was called — the classic cause of every rank crowding onto GPU 0 or of "
        "device-mismatch errors in the first forward."
    ),
    fix="Pass `device_ids=[local_rank]` (and `output_device=local_rank`). For CPU (gloo) training leave it out.",
    fix_safety="",
    gate=(tails(DDP), literal("cuda")),
    check=check,
    examples=(
        Invalid("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model.cuda())\n", 4, 9, end=(4, 26)),
        Valid(
            "import os\n\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
            "local_rank = int(os.environ[\"LOCAL_RANK\"])\nmodel = DDP(model.to(local_rank), device_ids=[local_rank])\n"
        ),
        Valid("from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)  # CPU / gloo\n"),
    ),
)
