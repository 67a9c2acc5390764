from __future__ import annotations

from typing import Iterable

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
import ast

from dp2ddp.rules.base import ESCAPE, DDP_CODE, DDP_CONTEXT, GAP, Nodes, Rule, Shape, Tokens, ast_kwarg, is_ddp_code, kwarg, string_value

import libcst as cst


class SumReductionLoss(Rule):
    code = "DDP015"
    name = "sum-reduction-loss-under-ddp"
    message = "`reduction=\"sum\"` loss under DDP: gradients are averaged across ranks, so their scale changes by 1/world_size"
    what = "In DDP code, checks for `torch.nn` losses and `torch.nn.functional` calls with `reduction=\"sum\"`."
    why = (
        "DDP averages gradients over ranks. Under DataParallel a summed loss gives the gradient of the sum over "
        "the whole batch; under DDP each rank sums its share and the all-reduce divides by the world size, so "
        "the gradient is `world_size` times smaller than before: the effective learning rate changes with the "
        "number of GPUs."
    )
    fix_doc = (
        "Multiply the loss by `dist.get_world_size()` before `backward()` to keep DataParallel's scale, or "
        "switch to `reduction=\"mean\"` and retune the learning rate deliberately."
    )
    needs = (DDP_CODE, Tokens("sum", ESCAPE), Shape(lambda ix: _shape(ix), "reduction", pattern=rb"\breduction" + GAP + rb"=(?!=)"))
    keep = (Nodes((ast.Call,), lambda c, _n: ast_kwarg(c, "reduction") is not None), DDP_CONTEXT)
    invalid = (
        "import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss(reduction=\"sum\")\n",
        "import torch.distributed as dist\nimport torch.nn.functional as F\n\nloss = F.mse_loss(out, y, reduction=\"sum\")\n",
    )
    valid = (
        "import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss()\n",
        "import torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss(reduction=\"sum\")  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        out = []
        for call in an.nodes_of(cst.Call):
            arg = kwarg(call, "reduction")
            if arg is None or string_value(arg.value) != "sum":
                continue
            if any(q.startswith("torch.nn.") for q in an.qnames(call.func)):
                out.append(self.finding(arg))
        return out


def _shape(ix) -> bool:
    """Pre-filter: a call with ``reduction="sum"``."""
    for call in ix.of(ast.Call):
        k = ast_kwarg(call, "reduction")
        if k is not None and isinstance(k.value, ast.Constant) and k.value.value == "sum":
            return True
    return False
