"""Give every training DataLoader a ``DistributedSampler`` and keep DP's batch semantics.

* ``DataLoader(ds, shuffle=S)`` -> ``DataLoader(ds, sampler=DistributedSampler(ds, shuffle=S))``;
  an explicit ``RandomSampler(ds)`` becomes ``DistributedSampler(ds)``; a dataset built
  inline (``DataLoader(TensorDataset(x, y), ...)``) is named first, since the sampler
  needs it too.
* DataParallel's batch is global, DDP's is per process: by default ``batch_size`` is
  divided by the world size, so the global batch, learning rate and loss curve stay as
  they were (``--keep-batch-size`` keeps the number per process). ``num_workers`` is
  divided by the processes on this machine (``LOCAL_WORLD_SIZE``: CPU cores are per
  machine), never below 1 when the original had 1 or more.
* Evaluation loaders stay whole on every rank (correct and simple); custom samplers,
  batch samplers and IterableDatasets are left alone with a warning.

The training loaders are shared with :mod:`set_epoch` through ``ctx.cache``.
"""

from __future__ import annotations

import ast
from typing import List, Optional

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, InsertBefore, Replace
from dp2ddp.model.core import COMPREHENSIONS, SemanticModel
from dp2ddp.model.loaders import Loader, distributed_sampler, loaders, subclass_loaders
from dp2ddp.model.names import RANDOM_SAMPLER

_HOISTABLE_OWNERS = (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)
_PURE_CALLS = {"os.cpu_count", "multiprocessing.cpu_count", "os.process_cpu_count"}


# a loader left unsharded keeps its batch_size: every rank then computes the original's
# batches and DDP averages equal gradients, the original's training repeated on each rank
_SAME_DATA = "; its batch_size is kept, so each rank repeats the original's batches"


def training_loaders(ctx: Context) -> List[Loader]:
    return ctx.cache.setdefault("training_loaders", [])  # type: ignore[return-value]


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    shared = training_loaders(ctx)
    for cls, call in subclass_loaders(m):
        out.append(ctx.warn(call, "DDP105", f"{cls.name} subclasses DataLoader: shard its sampler per rank by hand "
                            "(e.g. a DistributedSampler, or a per-rank share of its indices)" + _SAME_DATA))
    for loader in loaders(m):
        call = loader.call
        label = loader.label or "DataLoader"
        if distributed_sampler(m, loader.sampler_value):
            shared.append(loader)  # already sharded (a script's own distributed path)
            continue
        if loader.problem is not None:
            if loader.dataset is not None or loader.training:
                out.append(ctx.warn(call, "DDP105", loader.problem + _SAME_DATA))
            continue
        if not loader.training:
            out.append(ctx.note(call, "DDP108", f"{loader.label or 'evaluation DataLoader'} stays whole on every rank (each rank evaluates the full set: correct, not sharded)"))
            continue
        if ctx.mode == "plain" and not ctx.in_setup_region(call):
            out.append(ctx.warn(call, "DDP105", f"{label} is built before the process group exists; add a DistributedSampler by hand"))
            continue
        edits = []
        dataset = loader.dataset
        dataset_text = m.source(dataset)
        if not _plain(dataset):
            hoisted = _hoist_dataset(ctx, loader)
            if hoisted is None:
                out.append(ctx.warn(call, "DDP105", f"{label} reads an inline dataset expression dp2ddp cannot name: add a DistributedSampler by hand"))
                continue
            edits.extend(hoisted[0])
            dataset_text = hoisted[1]
        S = ctx.name("DistributedSampler")
        if loader.kwargs is not None and loader.kwargs_keys & {"shuffle", "batch_size"}:
            f = _through_kwargs(ctx, loader, dataset_text, edits)
            out.append(f)
            if f.severity == "info":
                shared.append(loader)
            continue
        random_sampler = loader.sampler_value if loader.sampler is not None and m.call_is(loader.sampler_value, RANDOM_SAMPLER) else None
        if random_sampler is not None:
            rs = random_sampler
            if loader.sampler.value is not rs:  # type: ignore[union-attr]
                # sampler=train_sampler, built elsewhere: change that RandomSampler call
                pass
            if len(rs.args) > 1 or rs.keywords:
                out.append(ctx.warn(rs, "DDP105", "RandomSampler options (replacement/num_samples/generator) are not carried over"))
            edits.append(Replace(ctx.cst(rs), ctx.expr("{S}({ds})", S=S, ds=rs.args[0])))
        else:
            shuffle_text = m.source(loader.shuffle.value) if loader.shuffle is not None else "False"
            sampler_text = f"{S}({dataset_text}, shuffle={shuffle_text})"
            if loader.shuffle is not None:
                old = ctx.cst(loader.shuffle)
                edits.append(Replace(old, lambda u, t=sampler_text: u.with_changes(keyword=cst.Name("sampler"), value=cst.parse_expression(t))))
            else:
                arg = cst.Arg(
                    keyword=cst.Name("sampler"),
                    value=cst.parse_expression(sampler_text),
                    equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
                )
                edits.append(Replace(ctx.cst(call), lambda u, a=arg: _append_arg(u, a)))
        if not ctx.options.keep_batch_size and loader.batch_size is not None:
            edits.append(_divide_batch(ctx, loader.batch_size))
        workers = loader.num_workers
        if workers is not None and not ctx.options.keep_batch_size:
            w = _divide_workers(ctx, workers.value)
            if w is not None:
                edits.append(w)
        shared.append(loader)
        what = (
            "global batch kept: batch_size per process = batch_size // world size"
            if not ctx.options.keep_batch_size
            else "batch_size kept per process (global batch grows with the world size)"
        )
        out.append(ctx.note(call, "DDP130", f"{label} gets a DistributedSampler; {what}", edits))
    return out


def _through_kwargs(ctx: Context, loader: Loader, dataset_text: str, edits: list) -> Finding:
    """``DataLoader(ds, **train_kwargs)`` whose dict may hold ``shuffle``/``batch_size``
    (pytorch/examples mnist): a copy of the dict with the sampler, ``shuffle=False`` and
    the per-process batch size, named before the loader."""
    m = ctx.m
    call = loader.call
    stmt = m.statement_of(call)
    if stmt is None or not ctx.bridge.alone_on_line(stmt) or not isinstance(stmt, (ast.Assign, ast.Expr, ast.Return)):
        return ctx.warn(call, "DDP105", f"{loader.label or 'DataLoader'} takes shuffle/batch_size from a **kwargs dict in a statement dp2ddp cannot extend: shard it by hand" + _SAME_DATA)
    d = m.source(loader.kwargs)
    keys = loader.kwargs_keys
    shuffle = m.source(loader.shuffle.value) if loader.shuffle is not None else (f'{d}.get("shuffle", False)' if "shuffle" in keys else "False")
    parts = [f"shuffle=False", f"sampler={ctx.name('DistributedSampler')}({dataset_text}, shuffle={shuffle})"]
    if "batch_size" in keys and loader.batch_size is None and not ctx.options.keep_batch_size:
        parts.append(f'batch_size={d}.get("batch_size", 1) // {ctx.name("dist")}.get_world_size()')
    elif loader.batch_size is not None and not ctx.options.keep_batch_size:
        edits.append(_divide_batch(ctx, loader.batch_size))
    if loader.shuffle is not None:
        edits.append(Replace(ctx.cst(call), lambda u: u.with_changes(args=[a for a in u.args if not (a.keyword is not None and a.keyword.value == "shuffle")])))
    base = f"{loader.target.id}_kwargs" if isinstance(loader.target, ast.Name) else "loader_kwargs"
    name = ctx.fresh_name(base)
    line = ctx.bridge.statement(stmt)
    new = ctx.stmt("{n} = dict({d}, {p})", n=name, d=d, p=", ".join(parts)).with_changes(leading_lines=getattr(line, "leading_lines", ()))
    edits.append(InsertBefore(line, (new,)))
    edits.append(Replace(line, lambda u: u.with_changes(leading_lines=())))
    edits.append(Replace(ctx.cst(loader.kwargs), cst.Name(name)))
    return ctx.note(call, "DDP130", f"{loader.label or 'DataLoader'} gets a DistributedSampler through a copy of its **kwargs dict; "
                    "global batch kept: batch_size per process = batch_size // world size", edits)


def _plain(expr: Optional[ast.AST]) -> bool:
    return isinstance(expr, (ast.Name, ast.Attribute))


def _hoist_dataset(ctx: Context, loader: Loader):
    """Name an inline dataset in a statement before the loader's: ``(edits, name)``, or
    ``None`` when its value may depend on the statement itself."""
    m = ctx.m
    call = loader.call
    stmt = m.statement_of(call)
    if stmt is None or not isinstance(stmt, _HOISTABLE_OWNERS) or not ctx.bridge.alone_on_line(stmt):
        return None
    if isinstance(stmt, (ast.For, ast.AsyncFor)) and not m.contains(stmt.iter, call):
        return None
    if isinstance(stmt, (ast.With, ast.AsyncWith)) and not any(m.contains(i.context_expr, call) for i in stmt.items):
        return None
    for a in m.ancestors(loader.dataset):
        if a is stmt:
            break
        if isinstance(a, (ast.Lambda, ast.IfExp, ast.BoolOp) + COMPREHENSIONS):
            return None
    base = f"{loader.target.id}_dataset" if isinstance(loader.target, ast.Name) else "train_dataset"
    name = ctx.fresh_name(base)
    line = ctx.bridge.statement(stmt)
    new = ctx.stmt("{n} = {v}", n=name, v=loader.dataset)
    edits = []
    if isinstance(line, cst.SimpleStatementLine) or isinstance(line, cst.BaseCompoundStatement):
        new = new.with_changes(leading_lines=getattr(line, "leading_lines", ()))
        edits.append(InsertBefore(line, (new,)))
        edits.append(Replace(line, lambda u: u.with_changes(leading_lines=())))
    else:
        return None
    edits.append(Replace(ctx.cst(loader.dataset), cst.Name(name)))
    return edits, name


def _paren_text(m: SemanticModel, expr: ast.AST) -> str:
    text = m.source(expr)
    if isinstance(expr, (ast.Name, ast.Attribute, ast.Constant, ast.Call, ast.Subscript)):
        return text
    return f"({text})"


def _divide_batch(ctx: Context, value: ast.AST) -> Replace:
    text = _paren_text(ctx.m, value)
    return Replace(ctx.cst(value), ctx.expr("{v} // {dist}.get_world_size()", v=text, dist=ctx.name("dist")))


def _side_effect_free(m: SemanticModel, expr: ast.AST) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Call):
            if n.args or n.keywords or not m.is_name(n.func, _PURE_CALLS):
                return False
        elif not isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.BinOp, ast.Subscript, ast.Load, ast.operator, ast.UnaryOp, ast.unaryop)):
            return False
    return True


def _divide_workers(ctx: Context, value: ast.AST) -> Optional[Replace]:
    """``num_workers=n`` -> ``max(min(n, 1), n // LOCAL_WORLD_SIZE)``: the cores of this machine
    split between its processes; 0 stays 0 and 1 or more never drops below 1."""
    m = ctx.m
    if isinstance(value, ast.Constant) and isinstance(value.value, int) and value.value <= 1:
        return None
    if not _side_effect_free(m, value):
        return None
    text = _paren_text(m, value)
    os_ = ctx.name("os")
    if isinstance(value, ast.Constant):
        new = f'max(1, {text} // int({os_}.environ.get("LOCAL_WORLD_SIZE", 1)))'
    else:
        new = f'max(min({text}, 1), {text} // int({os_}.environ.get("LOCAL_WORLD_SIZE", 1)))'
    return Replace(ctx.cst(value), ctx.expr(new))


def _append_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    args = list(call.args)
    if not args:
        return call.with_changes(args=[arg])
    last = args[-1]
    trailing = last.comma
    if isinstance(trailing, cst.Comma):
        # `f(a, b,\n)`: keep the trailing comma (and its newline) after the new argument
        ws = trailing.whitespace_after
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=ws if isinstance(ws, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")))
        args.append(arg.with_changes(comma=trailing))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(arg)
    return call.with_changes(args=args)
