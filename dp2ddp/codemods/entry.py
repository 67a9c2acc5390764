"""Is this file a training script dp2ddp should migrate at all?

* A **library module** (no ``if __name__ == "__main__":`` and no module-level code that
  runs: every DataParallel wrap sits in a function or class other scripts call) cannot
  set up a process group for its callers: the script that runs is what needs the
  migration. Refused (DDP116), with that advice; so is a library module that only tests
  for DataParallel (``isinstance(model, nn.DataParallel)``): its callers' models change
  with their scripts, not with it.
* An **inference-only script** (no ``.backward()`` or optimizer ``.step()`` anywhere, and
  the wrapped model only ever called: :func:`dp2ddp.model.inference.inference_only`)
  gains from DDP's processes only where its evaluation is shared out between them: it
  migrates when :mod:`shard_eval` can share out every evaluation loop, and is refused
  otherwise (DDP115), as is one whose wrapper is only saved, never called.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.entry_points import LIBRARY_MODULE, has_entry_point
from dp2ddp.model.kinds import is_module_class
from dp2ddp.model.inference import inference_only
from dp2ddp.model.uses import dp_wrapper_uses
from dp2ddp.model.wraps import dp_type_refs, dp_wraps


def check_entry(ctx: Context) -> List[Finding]:
    m = ctx.m
    wraps = dp_wraps(m)
    if ctx.role == "helper":
        return []  # a project's helper module: the entry script sets up the group and trains
    if not wraps:
        checks = dp_type_refs(m)
        if not checks:
            return []
        if not has_entry_point(m):
            return [ctx.block(checks[0], "DDP116", (
                f"{LIBRARY_MODULE} that tests for DataParallel and wraps nothing: its callers hand it their model, and alone its checks cannot "
                "change without theirs; migrate the script that runs with its helpers "
                "(`dp2ddp rewrite train.py --with-helpers`)"))]
        # an entry of a project migration: its helpers' wraps migrate with it
        return [_tests_only(ctx, checks[0])] if ctx.role == "script" else []
    if not has_entry_point(m):
        first = wraps[0].call
        return [
            ctx.block(
                first,
                "DDP116",
                f"{LIBRARY_MODULE}: the process group must be set up by the script that runs; migrate that script with its helpers "
                "(`dp2ddp rewrite train.py --with-helpers`)",
            )
        ]
    if inference_only(m):
        uses = dp_wrapper_uses(m, functional=True)
        saved = _only_saved(m, wraps, uses)
        if saved is not None:
            return [ctx.block(wraps[0].call, "DDP115", saved)]
        # shard_eval shares out its evaluation loops, or refuses the file (DDP115)
    return []


def _only_saved(m: SemanticModel, wraps, uses):
    """DDP115's line for a wrapper that is never called, only saved (``state_dict()``): it
    splits no batch; it is there for the ``module.`` keys of the weights it saves (a model
    module's ``__main__`` block that converts pretrained weights for the training script's
    DataParallel to load). None: the wrapper is used otherwise."""
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
    return None


def _tests_only(ctx: Context, check: ast.AST) -> Finding:
    """A script that wraps nothing and only tests for DataParallel: its model comes from a
    project module that wraps it (refused: that module migrates with the script, DDP151),
    or from elsewhere (a model loaded whole, pickled by the original's DataParallel run):
    then nothing here runs DataParallel, and its test must go on matching what it loads
    (DDP177). Either way the file is left as it was."""
    from dp2ddp.project import helper_dp_message, helpers_with_dp

    found = helpers_with_dp(ctx.m)
    if found:
        call, rel, line = found[0]
        return ctx.block(call, "DDP151", helper_dp_message(ctx.m, call, rel, line, tested=check.lineno))
    return ctx.block(check, "DDP177", (
        "this script wraps no model in DataParallel, and no project module it calls does: it only tests for one "
        "(a model loaded whole, pickled by a DataParallel run, or handed in), so nothing here runs DataParallel "
        "and there is nothing to migrate; the test stays, to go on matching what it is given. Migrate the script "
        "that trains"))
