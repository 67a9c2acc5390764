"""DDP015: `reduction="sum"` losses under DDP."""

from __future__ import annotations

import ast

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.losses import summed_losses, what_sums
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid


def check(m):
    if not is_ddp_code(m):
        return
    seen = set()
    for s in summed_losses(m):
        node = s.use if isinstance(s.arg, ast.ClassDef) else s.arg
        if id(node) not in seen:
            seen.add(id(node))
            yield Hit(node) if node is s.arg else Hit(node, message=TOTAL.format(what=what_sums(m, s.arg)))


TOTAL = "a loss that sums over the batch ({what}) under DDP: gradients are averaged across ranks, so their scale changes by 1/world_size"


RULE = Rule(
    code="DDP015",
    name="sum-reduction-loss-under-ddp",
    message="`reduction=\"sum\"` loss under DDP: gradients are averaged across ranks, so their scale changes by 1/world_size",
    what=(
        "In DDP code, checks for `torch.nn` losses and `torch.nn.functional` calls with `reduction=\"sum\"`, and for "
        "calls of a loss dp2ddp cannot name (one held on `self`, a project's own) given `reduction=\"sum\"`."
    ),
    why=(
        "DDP averages gradients over ranks. Under DataParallel a summed loss gives the gradient of the sum over "
        "the whole batch; under DDP each rank sums its share and the all-reduce divides by the world size, so "
        "the gradient is `world_size` times smaller than before: the effective learning rate changes with the "
        "number of GPUs."
    ),
    fix=(
        "Multiply the loss by `dist.get_world_size()` before `backward()` to keep DataParallel's scale, or "
        "switch to `reduction=\"mean\"` and retune the learning rate deliberately."
    ),
    fix_safety="",
    gate=(DDP_CODE, ("reduction", "size_average", "sum")),
    check=check,
    examples=(
        Invalid("import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss(reduction=\"sum\")\n", 4, 33, end=(4, 48)),
        Invalid(
            "import torch.distributed as dist\nimport torch.nn.functional as F\n\nloss = F.mse_loss(out, y, reduction=\"sum\")\n", 4, 27, end=(4, 42)
        ),
        Valid("import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss()\n"),
        Invalid(  # a loss function held on the object, picked by name: torch's reduction keyword says it sums
            "import torch.distributed as dist\n\n\ndef step(self, out, y):\n    return self.loss_func(out, y, reduction=\"sum\")\n",
            5, 35, end=(5, 50),
        ),
        Valid("import torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss(reduction=\"sum\")  # not DDP code\n"),
        Valid(  # a sum divided by its batch's size is a mean: the ranks' shares are equal
            "import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.MSELoss(reduction=\"sum\")\n"
            "loss = criterion(out, noise) / (img.size()[0] * 2)\n"
        ),
        Invalid(
            "import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.MSELoss(size_average=False)\n", 4, 24,
            end=(4, 42),
        ),
        Valid(  # scaled by the world size (what `dp2ddp rewrite` writes)
            "import torch.distributed as dist\nimport torch.nn as nn\n\n\ndef whole_sum(loss):\n"
            "    return loss * dist.get_world_size()\n\n\ncriterion = nn.MSELoss(reduction=\"sum\")\n"
            "whole_sum(criterion(out, y)).backward()\n"
        ),
        Valid(  # an attack's input gradient: each sample's is its own, whoever sums it
            "import torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\n\n\n"
            "def attack(model, x, y):\n    loss = F.cross_entropy(model(x), y, reduction=\"sum\")\n"
            "    return torch.autograd.grad(loss, [x])[0]\n\n\ndef step(model, x, y):\n"
            "    F.cross_entropy(model(attack(model, x, y)), y).backward()\n"
        ),
        Valid(
            "import torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\n\n\n"
            "def evaluate(model, x, y):\n    with torch.no_grad():\n        return F.mse_loss(model(x), y, reduction=\"sum\")\n\n\n"
            "def step(model, x, y):\n    F.mse_loss(model(x), y).backward()\n"
        ),
    ),
)
