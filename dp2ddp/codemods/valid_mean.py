"""A loss averaged over the valid targets (``ignore_index``) keeps the original's weighting.

See :class:`dp2ddp.model.valid_means.ValidMean`: DataParallel's loss, computed on the gathered
outputs, was the mean over the valid targets of the whole batch (padding tokens, ignored
pixels left out); under DDP each rank's mean covers its share, whose count of valid
targets differs from the other ranks', and the average of the ranks' gradients weights the
shares alike. The loss passes through ``valid_mean(loss, target, ignore_index)`` (written
once into the script): this rank's mean times its share of the valid targets (one
all-reduce of a count per step), which gives the original's gradient exactly, and its
loss when averaged over the ranks (DDP163). A mixed script's own distributed path is left
as it is.
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.valid_means import valid_count_means


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    found = valid_count_means(ctx.m)
    if not found:
        return []
    m = ctx.m
    name = ctx.fresh_name("valid_mean")
    ctx.define_after_imports("valid_mean.py.tmpl", valid_mean=name, torch=ctx.name("torch"), dist=ctx.name("dist"))
    out: List[Finding] = []
    for v in found:
        target, ignore = m.source(v.target), m.source(v.ignore)
        edit = Replace(ctx.cst(v.call), lambda u, t=target, i=ignore: ctx.expr(f"{name}({{loss}}, {{t}}, {{i}})", loss=u, t=t, i=i))
        out.append(ctx.note(v.call, "DDP163", f"the loss averages over the valid targets of `{target}` (ignore_index="
                            f"{ignore}), a count that differs between the ranks' shares: {name} weights each rank's mean by "
                            "its share of them, so the step is the original's", [edit]))
    return out
