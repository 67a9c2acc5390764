"""DDP018: a loss averaged over the valid targets (`ignore_index`) of each rank's share."""

from __future__ import annotations

import ast

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.valid_means import valid_count_means
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid


_COUNTS = frozenset({"torch.distributed.all_reduce", "torch.distributed.all_gather"})


def _weighted(m, call: ast.Call) -> bool:
    """The loss is handed to a function of the module that all-reduces (``valid_mean(loss,
    target, ignore_index)``, as `rewrite` writes it, or a hand-written equivalent)."""
    parent = m.parent(call)
    if not (isinstance(parent, ast.Call) and call in parent.args):
        return False
    func = m.resolve_call(parent)
    return func is not None and any(m.qualified_names(c.func) & _COUNTS for c in m.calls_in(func))


def check(m):
    if not is_ddp_code(m):
        return
    for v in valid_count_means(m):
        if not _weighted(m, v.call):
            yield Hit(v.call)


_HEAD = (
    "import torch\nimport torch.distributed as dist\nimport torch.nn as nn\n\n"
    "criterion = nn.CrossEntropyLoss(ignore_index=0)\n"
)
_STEP = "logits = model(x)\n{loss}\nloss.backward()\n"

RULE = Rule(
    code="DDP018",
    name="valid-count-mean-per-rank",
    message="a loss averaged over each rank's valid targets (`ignore_index`): under DDP the ranks' shares weigh alike, not by their valid targets",
    what=(
        "In DDP code, checks for `CrossEntropyLoss`/`NLLLoss` (class or functional) with an explicit `ignore_index` and "
        "the mean reduction, computed in the training step outside a module's `forward`, whose value is not weighted "
        "by the rank's share of the valid targets."
    ),
    why=(
        "The mean over the valid targets (padding tokens, ignored pixels left out) of one process's share of the batch "
        "has its own count; DDP averages the ranks' gradients, so each share weighs the same however many valid "
        "targets it holds. Under DataParallel (or one process) the loss was the mean over the whole batch's valid "
        "targets: the step differs (a padded-sequence model measured 0.35 % apart from the first step)."
    ),
    fix=(
        "Weight the rank's mean by its share of the valid targets: `loss * count * world_size / total`, the counts "
        "all-reduced (`dp2ddp rewrite` writes `valid_mean(loss, target, ignore_index)`); or sum the losses and divide "
        "by the all-reduced count."
    ),
    fix_safety="",
    gate=(DDP_CODE, ("ignore_index",)),
    accepted_by=("DDP176", "DDP185"),
    check=check,
    examples=(
        Invalid(_HEAD + _STEP.format(loss="loss = criterion(logits, y)"), 7, 8, end=(7, 28)),
        Valid((_HEAD + _STEP.format(loss="loss = criterion(logits, y)")).replace("import torch.distributed as dist\n", "")),
        Valid(
            _HEAD + "\n\ndef valid_mean(loss, target, ignore_index):\n    count = (target != ignore_index).sum()\n"
            "    total = count.clone()\n    dist.all_reduce(total)\n    return loss * count * dist.get_world_size() / total\n\n\n"
            + _STEP.format(loss="loss = valid_mean(criterion(logits, y), y, 0)")
        ),
        Valid(_HEAD.replace("ignore_index=0", "") + _STEP.format(loss="loss = criterion(logits, y)")),
    ),
)
