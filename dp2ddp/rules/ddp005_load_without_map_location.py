"""DDP005: `torch.load` without `map_location` in DDP code."""

from __future__ import annotations

from dp2ddp.model.call_args import LOAD_PARAMS, argument
from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.names import LOAD
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, has_double_star, tails


def check(m):
    if not is_ddp_code(m):
        return
    for call in m.calls(LOAD):
        if argument(call, LOAD_PARAMS, "map_location") is None and not has_double_star(call):
            yield Hit(call)


_HEAD = "import torch\nimport torch.distributed as dist\n\n"

RULE = Rule(
    code="DDP005",
    name="load-without-map-location",
    message="`torch.load` without `map_location` loads onto the device the tensors were saved from (usually GPU 0)",
    what="In DDP code, checks for `torch.load(...)` calls without a `map_location` argument.",
    why=(
        "A checkpoint saved by rank 0 holds tensors tagged `cuda:0`. Loading it without `map_location` makes "
        "every rank allocate those tensors on GPU 0: GPU 0 runs out of memory, or each rank silently keeps a "
        "copy of the weights on the wrong device."
    ),
    fix='Pass `map_location="cpu"` (then move to the local device) or `map_location=f"cuda:{local_rank}"`.',
    fix_safety="",
    gate=(DDP_CODE, tails(LOAD)),
    check=check,
    examples=(
        Invalid(_HEAD + "state = torch.load(\"ckpt.pt\")\nmodel.load_state_dict(state)\n", 4, 9, end=(4, 30)),
        Valid(_HEAD + "state = torch.load(\"ckpt.pt\", map_location=\"cpu\")\n"),
        Valid(_HEAD + "state = torch.load(\"ckpt.pt\", \"cpu\")\n"),
        Valid("import torch\n\nstate = torch.load(\"ckpt.pt\")  # not DDP code\n"),
    ),
)
