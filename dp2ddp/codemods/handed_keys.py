"""The ``state_dict`` keys of a wrapper the script hands to another project module.

``Trainer(model, opt, loader)`` of ``trainer.py`` saves ``self.model.state_dict()`` and
resumes with ``self.model.load_state_dict(...)`` on the wrapper it is handed
(:mod:`dp2ddp.model.handed_wrappers`). Where the key policy of the wrap keeps the keys
plain (the original wrapped only with several GPUs, and the project's evaluation loads
into a bare model), the DDP wrapper, there on every run, would add ``module.``:

* in the entry script of a project migration (``rewrite --with-helpers``) that migrates
  that module too, a note says which keys it keeps (DDP150);
* in that module (the ``helper`` role), the calls go to the bare model behind a DDP
  wrapper (``(self.model.module if isinstance(self.model, DistributedDataParallel) else
  self.model).state_dict()``; a DataParallel other scripts hand in keeps its keys), and
  loads take a checkpoint with or without ``module.`` (``load_either_keys``, DDP170);
* a script whose migration cannot edit that module is refused (DDP189): its keys would
  change, and the project's own loaders, or the migration's resume of the original's
  files, would fail;
* a class or function of the script's own that keeps or is handed the wrapper is routed
  in the script, as a helper module's are there (where wrap_ddp does not follow the
  wrapper into it itself).
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import Wrappers
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.checkpoint_keys import PLAIN
from dp2ddp.model.collectives import var_key
from dp2ddp.model.handed_wrappers import CLASS_NAME, handed_key_policies, key_calls


NEEDS = (Wrappers,)


def propose(ctx: Context) -> List[Finding]:
    if ctx.role == "helper":
        return _route(ctx, {(line, col): why for line, col, why in getattr(ctx.options, "plain_keys", ())})
    out: List[Finding] = []
    said = set()
    followed = ctx.need(Wrappers).keys  # uses wrap_ddp routes itself (the wrapper followed into a parameter)
    own = {}
    handed_bare = set()
    for use, policy in handed_key_policies(ctx.m):
        if policy.default != PLAIN:  # type: ignore[attr-defined]
            continue
        if use.bare_elsewhere:
            # the other branch hands `<arg>.module`: the original handed the bare model on both paths
            if id(use.arg) not in handed_bare:
                handed_bare.add(id(use.arg))
                text = ctx.m.source(use.arg)
                out.append(ctx.note(use.arg, "DDP124", (
                    f"{ctx.m.source(use.call.func)}(...) is handed `{text}.module` here too: the other branch hands "
                    f"`{text}.module`, so the original handed the bare model on both paths ({use.where} saves or loads its "
                    "state_dict), and the migrated wrap runs on both"),
                    [Replace(ctx.cst(use.arg), ctx.expr(ctx.module_of(text)))]))
            continue
        if use.own:
            # a class or function of the script's own: routed here, as a helper module's are there
            if var_key(ctx.m, use.subject) not in followed:
                own[(use.subject.lineno, use.subject.col_offset)] = policy.reason  # type: ignore[attr-defined]
            continue
        if use.module in said or use.method == CLASS_NAME:
            continue
        said.add(use.module)
        what = f"{use.text}.{use.method}(...) of the wrapper handed to {ctx.m.source(use.call.func)}(...) ({use.where})"
        if ctx.migrated_with(use.module):
            out.append(ctx.note(use.call, "DDP150", f"{what} keeps the keys without `module.` (the bare model behind "
                                f"the DDP wrapper, in that module's migration): {policy.reason}"))  # type: ignore[attr-defined]
        else:
            out.append(ctx.block(use.call, "DDP189", (
                f"{what} must keep keys without `module.` ({policy.reason}), and the DDP wrapper, there on every run, "  # type: ignore[attr-defined]
                f"has `module.` keys; this migration does not edit {use.rel}: migrate with `--with-helpers` (which edits it), "
                f"or call {use.method} on `{use.text}.module` there by hand")))
    return out + (_route(ctx, own) if own else [])


def _route(ctx: Context, wanted) -> List[Finding]:
    """The ``state_dict``/``load_state_dict`` calls whose subjects stand at ``wanted``
    (``(line, column) -> why``) go to the bare model behind a DDP wrapper."""
    m = ctx.m
    if not wanted:
        return []
    out: List[Finding] = []
    for subject, method in key_calls(m.tree):
        why = wanted.get((subject.lineno, subject.col_offset))
        if why is None:
            continue
        text = m.source(subject)
        bare = f"{text}.module if isinstance({text}, {ctx.name('DDP')}) else {text}"
        if method == CLASS_NAME:
            alone = isinstance(m.parent(subject), ast.Call)  # ``type(<subject>)``: no parentheses needed
            out.append(ctx.note(subject, "DDP150", f"the class name of {text} is the bare model's, as its state_dict keys "
                                f"are: {why}", [Replace(ctx.cst(subject), ctx.expr(bare if alone else f"({bare})"))]))
        elif method == "state_dict":
            out.append(ctx.note(subject, "DDP150", f"state_dict keys of {text} without `module.` (the bare model behind a "
                                f"DDP wrapper): {why}", [Replace(ctx.cst(subject), ctx.expr(f"({bare})"))]))
        else:
            helper = ctx.load_either_keys()
            out.append(ctx.note(subject, "DDP170", (
                f"{text}.load_state_dict(...) loads into the bare model behind a DDP wrapper through {helper}(...): a "
                f"checkpoint with DataParallel's `module.` key prefix or without it loads either way ({why})"),
                [Replace(ctx.cst(m.parent(subject)), ctx.expr(f"{helper}({bare})"))]))
    return out
