"""Is this file a training script dp2ddp should migrate at all?

* A **library module** (no ``if __name__ == "__main__":`` and no module-level code that
  runs: every DataParallel wrap sits in a function or class other scripts call) cannot
  set up a process group for its callers: the script that runs is what needs the
  migration. Refused (DDP116), with that advice.
* An **inference-only script** (no ``.backward()`` or optimizer ``.step()`` anywhere, and
  the wrapped model only ever called) gains nothing from DDP, which synchronises
  gradients; DataParallel there only splits batches. Refused (DDP115).
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.entry_points import has_entry_point
from dp2ddp.model.kinds import is_module_class
from dp2ddp.model.names import DDP, DP, DP_FUNCTIONAL
from dp2ddp.model.training import training_site
from dp2ddp.model.uses import dp_wrapper_uses
from dp2ddp.model.wraps import dp_wraps


def _trains_elsewhere(m: SemanticModel, use) -> bool:
    """The wrapped model is handed to code of another module (``trainer.fit(model)``),
    which may train it."""
    if use.kind != "other":
        return False
    parent = m.parent(use.node)
    call = m.parent(parent) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call) or call.func is use.node:
        return False
    q = m.qualified_names(call.func)
    if q & (DP | DP_FUNCTIONAL | DDP):
        return False  # the wrap itself
    return not any(x.startswith("builtins.") for x in q)


def check_entry(ctx: Context) -> List[Finding]:
    m = ctx.m
    wraps = dp_wraps(m)
    if not wraps or ctx.role == "helper":
        return []  # a project's helper module: the entry script sets up the group and trains
    if not has_entry_point(m):
        first = wraps[0].call
        return [
            ctx.block(
                first,
                "DDP116",
                "library module (no `if __name__ == \"__main__\":` and no module-level code that runs): the process group "
                "must be set up by the script that runs; migrate that script with its helpers "
                "(`dp2ddp rewrite train.py --with-helpers`)",
            )
        ]
    if training_site(m) is None:
        uses = dp_wrapper_uses(m, functional=True)
        if not any(_trains_elsewhere(m, u) for u in uses):
            return [ctx.block(wraps[0].call, "DDP115", _no_training_message(m, wraps, uses))]
    return []


def _no_training_message(m: SemanticModel, wraps, uses) -> str:
    """DDP115's line: what the file does with its wrapper when it trains nowhere. A wrapper
    that is never called, only saved (``state_dict()``), splits no batch: it is there for
    the ``module.`` keys of the weights it saves (a model module's ``__main__`` block that
    converts pretrained weights for the training script's DataParallel to load)."""
    after = [u for u in uses if all(u.node.lineno > (w.call.end_lineno or w.call.lineno) for w in wraps)]
    if after and all(u.kind == "state_dict" and u.attr == "state_dict" for u in after):
        where = ""
        guard = m.main_guard
        if guard is not None and all(m.contains(guard, w.call) for w in wraps):
            models = [name for name, c in m.classes.items() if is_module_class(m, c)]
            if models:
                where = f"the `__main__` block of the module that defines {', '.join(models[:2])}: "
        return (
            f"{where}no training step, and the DataParallel wrapper is never called, only saved (state_dict, line "
            f"{after[0].node.lineno}): it gives the saved weights DataParallel's `module.` keys, which "
            "DistributedDataParallel's state_dict has too, so there is nothing to migrate here — keep it; the script "
            "that trains on these weights is the one to migrate"
        )
    return (
        "no training step in this file (no .backward(), no optimizer.step()): DistributedDataParallel "
        "synchronises gradients and gains nothing for inference; DataParallel here only splits batches — "
        "keep it, or shard the data per process by hand"
    )
