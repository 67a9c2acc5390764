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
from dp2ddp.model.names import DDP, DP, DP_FUNCTIONAL
from dp2ddp.model.training import training_site
from dp2ddp.model.uses import wrapper_keys, wrapper_uses
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
        seeds = set()
        for w in wraps:
            from dp2ddp.model.collectives import assigned_keys

            seeds.update(assigned_keys(m, w.outer))
        uses = wrapper_uses(m, wrapper_keys(m, seeds)) if seeds else []
        if not any(_trains_elsewhere(m, u) for u in uses):
            return [
                ctx.block(
                    wraps[0].call,
                    "DDP115",
                    "no training step in this file (no .backward(), no optimizer.step()): DistributedDataParallel "
                    "synchronises gradients and gains nothing for inference; DataParallel here only splits batches — "
                    "keep it, or shard the data per process by hand",
                )
            ]
    return []
