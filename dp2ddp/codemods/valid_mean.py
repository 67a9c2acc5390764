"""A loss averaged over the valid targets (``ignore_index``) keeps the original's weighting.

See :class:`dp2ddp.model.valid_means.ValidMean`: DataParallel's loss, computed on the gathered
outputs, was the mean over the valid targets of the whole batch (padding tokens, ignored
pixels left out); under DDP each rank's mean covers its share, whose count of valid
targets differs from the other ranks', and the average of the ranks' gradients weights the
shares alike. The loss passes through ``valid_mean(loss, target, ignore_index)`` (written
once into the script): this rank's mean times its share of the valid targets (one
all-reduce of a count per step), which gives the original's gradient exactly, and its
loss when averaged over the ranks (DDP163). A loss the step divides by a count it sums
from the batch itself (``(loss * mask).sum() / mask.sum()``: :class:`CountMean`) gets the
count of every rank's share instead, over the world size: ``global_count(mask.sum())``
(one all-reduce of a number per step), as fairseq normalises by its global token count
(DDP169). Such a loss handed to a project module's training code (``Trainer(model, model_fn)``)
is out of the script's reach: refused (DDP185). A mixed script's own distributed path is
left as it is.
"""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.valid_means import batch_means, count_means, valid_count_means


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    out = _counts(ctx) + _batch_means(ctx) + _handed(ctx)
    found = valid_count_means(ctx.m)
    if not found:
        return out
    m = ctx.m
    shared = [v for v in found if v.shared is not None]
    if shared:
        for v in shared:
            other = " ".join(m.source(v.shared).split())[:60]
            out.append(ctx.block(v.call, "DDP176", (
                f"`{' '.join(m.source(v.call).split())[:60]}` averages over the valid targets (ignore_index="
                f"{m.source(v.ignore)}) where `{' '.join(m.source(v.made).split())[:50]}` computes it, but the same name "
                f"also holds the loss bound at line {v.shared.lineno} (`{other}`), which may not: weighting every call by "
                "its share of valid targets would change that loss's step; give each loss a name of its own, then migrate")))
        return out
    name = ctx.fresh_name("valid_mean")
    ctx.define_after_imports("valid_mean.py.tmpl", valid_mean=name, torch=ctx.name("torch"), dist=ctx.name("dist"))
    for v in found:
        target, ignore = m.source(v.target), m.source(v.ignore)
        edit = Replace(ctx.cst(v.call), lambda u, t=target, i=ignore: ctx.expr(f"{name}({{loss}}, {{t}}, {{i}})", loss=u, t=t, i=i))
        out.append(ctx.note(v.call, "DDP163", f"the loss averages over the valid targets of `{target}` (ignore_index="
                            f"{ignore}), a count that differs between the ranks' shares: {name} weights each rank's mean by "
                            "its share of them, so the step is the original's", [edit]))
    return out


def _counts(ctx: Context) -> List[Finding]:
    found = count_means(ctx.m)
    return _divisor_through(ctx, "global_count", [(c.division, c.count) for c in found], "DDP169", lambda count, name: (
        f"the loss is divided by `{count}`, a count of the batch that differs between the ranks' shares: {name}({count}) "
        "is the count of every rank's share over the world size, so the step is the original's"), torch=True)


_COUNTED_APART = ("under DDP each process would divide by its own share's count and the ranks' means would count alike, "
                  "another step than the original's; divide by the count of every rank's share there (all-reduce the "
                  "count, over the world size), then migrate")


def _handed(ctx: Context) -> List[Finding]:
    """DDP185 for a loss that averages over a count of its batch in code the rewrite cannot
    edit: project code the script's own step calls
    (:func:`dp2ddp.model.valid_means.project_count_means`), or a loss the script hands to a
    project module's training code (:func:`dp2ddp.model.handed_losses.handed_count_means`)."""
    from dp2ddp.model.handed_losses import handed_count_means
    from dp2ddp.model.valid_means import project_count_means

    m = ctx.m
    own = [ctx.block(p.call, "DDP185", (
        f"`{' '.join(m.source(p.call).split())[:60]}` runs {p.name}, "
        f"{'a loss of this script dp2ddp cannot rewrite' if p.own else 'project code'} that averages the loss over a count "
        f"of its batch ({p.where}): {_COUNTED_APART}")) for p in project_count_means(m)]
    return own + [ctx.block(h.arg, "DDP185", (
        f"`{' '.join(m.source(h.arg).split())[:60]}`, handed to {m.source(h.call.func)}() as `{h.param}` and called where "
        f"it trains ({h.rel}:{h.line}), averages the loss over a count of its batch ({where}): {_COUNTED_APART}"))
        for h, where in handed_count_means(m)]


def _divisor_through(ctx: Context, helper: str, found, code: str, message, torch: bool = False) -> List[Finding]:
    """Each ``(division, divisor)`` of ``found`` divides by ``helper(divisor)`` instead, the
    helper written once into the script from ``<helper>.py.tmpl``."""
    if not found:
        return []
    m = ctx.m
    name = ctx.fresh_name(helper)
    names = {helper: name, "dist": ctx.name("dist")}
    if torch:
        names["torch"] = ctx.name("torch")
    ctx.define_after_imports(f"{helper}.py.tmpl", **names)
    out: List[Finding] = []
    for division, divisor in found:
        edit = Replace(ctx.cst(divisor), lambda u: ctx.expr(f"{name}({{d}})", d=u))
        out.append(ctx.note(division, code, message(m.source(divisor), name), [edit]))
    return out


def _batch_means(ctx: Context) -> List[Finding]:
    found = batch_means(ctx.m)
    if not found:
        return []
    m = ctx.m
    out: List[Finding] = []
    for b in found:
        if b.mixed is not None:
            out.append(ctx.block(b.division, "DDP183", (
                f"the loss is a mean over its batch divided by the batch's size `{m.source(b.size)}`, together with "
                f"`{' '.join(m.source(b.mixed).split())[:60]}` (line {b.mixed.lineno}), which dp2ddp cannot show is a mean: "
                "under DDP each rank divides by its share's size, world_size times smaller; dividing the mean by the "
                "whole batch's size would change the other term's step if it is a sum; divide each term on its own, "
                "then migrate")))
    if out:
        return out
    return _divisor_through(ctx, "whole_batch_size", [(b.division, b.size) for b in found], "DDP182", lambda size, name: (
        f"the loss is a mean over its batch divided by the batch's size `{size}` again: each rank's share is world_size "
        f"times smaller, so {name}({size}) divides by the whole batch's size and the step is the original's"))
