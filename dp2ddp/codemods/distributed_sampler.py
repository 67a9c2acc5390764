"""Give every training DataLoader a ``DistributedSampler`` and keep DP's batch semantics.

* ``DataLoader(ds, shuffle=S)`` -> ``DataLoader(ds, sampler=DistributedSampler(ds, shuffle=S))``;
  an explicit ``RandomSampler(ds)`` becomes ``DistributedSampler(ds)``.
* DataParallel's batch is global, DDP's is per process: by default ``batch_size`` (and
  ``num_workers``) are divided by the world size, so the global batch, learning rate and
  loss curve stay as they were (``--keep-batch-size`` keeps the number per process).
* Evaluation loaders stay whole on every rank (correct and simple); custom samplers,
  batch samplers and IterableDatasets are left alone with a warning.

The training loaders found here are shared with :mod:`set_epoch` through ``ctx.cache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import libcst as cst

from dp2ddp.analysis import DATALOADER_NAMES, code
from dp2ddp.codemods.context import MigrationContext
from dp2ddp.engine import Finding, Fix, InsertBefore, Replace

CODE_SAMPLER = "DDP130"
CODE_LEFT = "DDP105"
CODE_EVAL = "DDP108"

RANDOM_SAMPLER = {"torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler"}
ITERABLE_DATASET = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
EVAL_WORDS = ("test", "val", "eval", "dev", "valid")


@dataclass
class Loader:
    call: cst.Call
    stmt: Optional[cst.BaseStatement]
    target: Optional[cst.BaseExpression]  # what the loader is assigned to, if anything
    function: Optional[cst.FunctionDef]  # the function that builds it


def _kw(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def _assign_target(an, call) -> Optional[cst.BaseExpression]:
    parent = an.parent(call)
    if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
        return parent.targets[0].target
    if isinstance(parent, cst.AnnAssign) and parent.value is call:
        return parent.target
    return None


def _label(target, func) -> str:
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute):
        return target.attr.value
    return func.name.value if func is not None else ""


def _paren(expr: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)) or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _divide(ctx: MigrationContext, arg: cst.Arg) -> Replace:
    world = ctx.expr("{dist}.get_world_size()", dist=ctx.name("dist"))
    new = cst.BinaryOperation(
        left=_paren(arg.value),
        operator=cst.FloorDivide(
            whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")
        ),
        right=world,
    )
    return Replace(arg.value, new)


def _iterable_dataset_classes(ctx: MigrationContext) -> set:
    out = set()
    for cls in ctx.an.nodes_of(cst.ClassDef):
        if any(ctx.an.is_name(b.value, ITERABLE_DATASET) for b in cls.bases):
            out.add(cls.name.value)
    return out


def _is_iterable_dataset(ctx: MigrationContext, expr: cst.BaseExpression, classes: set) -> bool:
    if isinstance(expr, cst.Call):
        return (isinstance(expr.func, cst.Name) and expr.func.value in classes) or ctx.an.is_name(
            expr.func, ITERABLE_DATASET
        )
    if isinstance(expr, cst.Name) and classes:
        for assign in ctx.an.nodes_of(cst.Assign):
            if (
                len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)
                and assign.targets[0].target.value == expr.value
                and _is_iterable_dataset(ctx, assign.value, classes)
            ):
                return True
    return False


def _follow_name(an, expr: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression:
    """``sampler=train_sampler``: the value of the single assignment to that name in the
    same function (or at module level), else the expression itself."""
    if not isinstance(expr, cst.Name):
        return expr
    func = an.enclosing_function(at)
    values = [
        a.value
        for a in an.nodes_of(cst.Assign)
        if len(a.targets) == 1
        and isinstance(a.targets[0].target, cst.Name)
        and a.targets[0].target.value == expr.value
        and an.enclosing_function(a) is func
    ]
    return values[0] if len(values) == 1 else expr


def training_loaders(ctx: MigrationContext) -> List[Loader]:
    return ctx.cache_get("training_loaders", list)


def propose(ctx: MigrationContext) -> List[Finding]:
    an = ctx.an
    findings: List[Finding] = []
    loaders = training_loaders(ctx)
    iterable_classes = _iterable_dataset_classes(ctx)
    for call in an.calls(DATALOADER_NAMES):
        target = _assign_target(an, call)
        func = an.enclosing_function(call)
        label = _label(target, func)
        positional = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args):
            findings.append(ctx.warn(call, CODE_LEFT, "DataLoader built from *args/**kwargs: add a DistributedSampler by hand"))
            continue
        dataset_arg = positional[0] if positional else _kw(call, "dataset")
        if dataset_arg is None:
            continue
        batch_arg = positional[1] if len(positional) > 1 else _kw(call, "batch_size")
        if len(positional) > 2:
            findings.append(
                ctx.warn(call, CODE_LEFT, "DataLoader with positional shuffle/sampler arguments: add a DistributedSampler by hand")
            )
            continue
        shuffle_arg = _kw(call, "shuffle")
        sampler_arg = _kw(call, "sampler")
        if _kw(call, "batch_sampler") is not None:
            findings.append(
                ctx.warn(call, CODE_LEFT, f"{label or 'DataLoader'} uses a batch_sampler: shard it per rank by hand (every rank now sees all data)")
            )
            continue
        if _is_iterable_dataset(ctx, dataset_arg.value, iterable_classes):
            findings.append(
                ctx.warn(call, CODE_LEFT, f"{label or 'DataLoader'} reads an IterableDataset: shard it per rank by hand (every rank now sees all data)")
            )
            continue

        random_sampler = None
        if sampler_arg is not None:
            sampler_value = _follow_name(an, sampler_arg.value, call)
            if an.call_is(sampler_value, RANDOM_SAMPLER) and sampler_value.args:
                random_sampler = sampler_value
            else:
                findings.append(
                    ctx.warn(
                        call,
                        CODE_LEFT,
                        f"{label or 'DataLoader'} uses a custom sampler: shard it per rank by hand "
                        "(e.g. DistributedSampler or a per-rank subset); every rank now sees all data",
                    )
                )
                continue

        shuffle_value = shuffle_arg.value if shuffle_arg is not None else None
        lowered = label.lower()
        is_false = isinstance(shuffle_value, cst.Name) and shuffle_value.value == "False"
        if random_sampler is not None:
            training = True
        elif shuffle_value is not None and not is_false:
            training = True
        else:
            training = "train" in lowered and not any(w in lowered for w in EVAL_WORDS)
        if not training:
            findings.append(
                ctx.note(
                    call,
                    CODE_EVAL,
                    f"{label or 'evaluation DataLoader'} stays whole on every rank (each rank evaluates the full set)",
                )
            )
            continue
        if not ctx.in_setup_region(call):
            findings.append(
                ctx.warn(call, CODE_LEFT, f"{label or 'DataLoader'} is built before the process group exists; add a DistributedSampler by hand")
            )
            continue

        edits = []
        # the dataset expression appears twice (loader and sampler): it must be a plain name
        dataset_expr = dataset_arg.value
        if not isinstance(dataset_expr, (cst.Name, cst.Attribute)):
            stmt = an.statement_of(call)
            if isinstance(target, cst.Name) and stmt is not None:
                ds_name = ctx.fresh_name(f"{target.value}_dataset")
                edits.append(
                    InsertBefore(stmt, (ctx.stmt("{n} = {v}", n=ds_name, v=dataset_expr).with_changes(leading_lines=stmt.leading_lines),))
                )
                edits.append(Replace(stmt, lambda u: u.with_changes(leading_lines=())))
                edits.append(Replace(dataset_expr, cst.Name(ds_name)))
                dataset_expr = cst.Name(ds_name)
            else:
                findings.append(
                    ctx.warn(call, CODE_LEFT, "DataLoader over an inline dataset expression: add a DistributedSampler by hand")
                )
                continue

        if random_sampler is not None:
            edits.append(Replace(random_sampler.func, ctx.expr("{S}", S=ctx.name("DistributedSampler"))))
            rs_args = list(random_sampler.args)
            if len(rs_args) > 1 or any(a.keyword is not None for a in rs_args):
                findings.append(ctx.warn(random_sampler, CODE_LEFT, "RandomSampler options (replacement/num_samples) are not carried over"))
                edits.append(Replace(random_sampler, lambda u: u.with_changes(args=[u.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])))
        else:
            shuffle_text = code(shuffle_value) if shuffle_value is not None else "False"
            sampler = cst.Arg(
                keyword=cst.Name("sampler"),
                value=ctx.expr(
                    "{S}({ds}, shuffle={sh})", S=ctx.name("DistributedSampler"), ds=dataset_expr, sh=shuffle_text
                ),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            )
            if shuffle_arg is not None:
                edits.append(Replace(shuffle_arg, sampler.with_changes(comma=shuffle_arg.comma, equal=shuffle_arg.equal)))
            else:
                edits.append(Replace(call, lambda u, sampler=sampler: _append_arg(u, sampler)))

        if not ctx.options.keep_batch_size:
            if batch_arg is not None:
                edits.append(_divide(ctx, batch_arg))
            workers = _kw(call, "num_workers")
            if workers is not None and not (isinstance(workers.value, cst.Integer) and workers.value.value in ("0", "1")):
                edits.append(_divide(ctx, workers))
        loaders.append(Loader(call, an.statement_of(call), target, func))
        what = "global batch kept: batch_size per process = batch_size // world size" if not ctx.options.keep_batch_size else "batch_size kept per process (global batch grows with the world size)"
        f = ctx.note(call, CODE_SAMPLER, f"{label or 'DataLoader'} gets a DistributedSampler; {what}")
        f.fix = Fix(edits)
        findings.append(f)
    return findings


def _append_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    args = list(call.args)
    if not args:
        return call.with_changes(args=[arg])
    last = args[-1]
    trailing = last.comma
    if isinstance(trailing, cst.Comma):
        # `f(a, b,\n)`: keep the trailing comma (and its newline) after the new argument
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=_space_like(trailing)))
        args.append(arg.with_changes(comma=trailing))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(arg)
    return call.with_changes(args=args)


def _space_like(comma: cst.Comma):
    ws = comma.whitespace_after
    if isinstance(ws, cst.ParenthesizedWhitespace):
        return ws
    return cst.SimpleWhitespace(" ")
