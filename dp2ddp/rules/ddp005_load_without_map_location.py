from __future__ import annotations

from typing import Iterable

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import DDP_CODE, DDP_CONTEXT, Refs, ast_kwarg, calls_to, Rule, has_star_kwargs, is_ddp_code, kwarg, positional

LOAD = frozenset({"torch.load", "torch.serialization.load"})


class LoadWithoutMapLocation(Rule):
    code = "DDP005"
    name = "load-without-map-location"
    message = "`torch.load` without `map_location` loads onto the device the tensors were saved from (usually GPU 0)"
    what = "In DDP code, checks for `torch.load(...)` calls without a `map_location` argument."
    why = (
        "A checkpoint saved by rank 0 holds tensors tagged `cuda:0`. Loading it without `map_location` makes "
        "every rank allocate those tensors on GPU 0: GPU 0 runs out of memory, or each rank silently keeps a "
        "copy of the weights on the wrong device."
    )
    fix_doc = 'Pass `map_location="cpu"` (then move to the local device) or `map_location=f"cuda:{local_rank}"`.'
    needs = (DDP_CODE, Refs(LOAD, called=True))
    keep = (calls_to(LOAD, lambda c: ast_kwarg(c, "map_location") is None), DDP_CONTEXT)
    invalid = (
        "import torch\nimport torch.distributed as dist\n\nstate = torch.load(\"ckpt.pt\")\nmodel.load_state_dict(state)\n",
    )
    valid = (
        "import torch\nimport torch.distributed as dist\n\nstate = torch.load(\"ckpt.pt\", map_location=\"cpu\")\n",
        "import torch\nimport torch.distributed as dist\n\nstate = torch.load(\"ckpt.pt\", \"cpu\")\n",
        "import torch\n\nstate = torch.load(\"ckpt.pt\")  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        out = []
        for call in an.calls(LOAD):
            if kwarg(call, "map_location") is not None or has_star_kwargs(call) or len(positional(call)) >= 2:
                continue
            out.append(self.finding(call))
        return out
